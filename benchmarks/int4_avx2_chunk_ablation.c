/* A stand-alone copy of the exact 4-bit AVX2 GEMV step (custom_ops/src/qo_cpu_int4.c, gemv_avx2_chunk at M = 1:
 * 32 weights of one row a chunk, 4 accumulators) and variants with one part removed or reorganised, to find what
 * bounds it on a CPU. 128 rows x 4096 (g32; the weight, 256 KiB, in L2), one thread, cycles per chunk at the
 * clock given in GHZ (default 2.4: the Zen 1 this was written on, see benchmarks/x86_op_throughput.c for a way to
 * measure it). Every variant's accumulators all reach the printed sum, so no part is dead code.
 *
 *     cc -O3 -mavx2 -mfma -ffp-contract=off benchmarks/int4_avx2_chunk_ablation.c -o /tmp/i4abl && /tmp/i4abl
 *
 * Not a test and not run by CI; results are quoted in custom_ops/README.md ("The AVX2 path on an AVX2-only CPU").
 * The variants without the multiplication or the conversion compute other numbers: they are timings only. */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct { __m256i take[4]; __m256i shift; __m256i m4; __m256i magic; __m256i takelo[4]; } C;
static C mk(void){ C c; for(int q=0;q<4;q++){ int8_t t[32],u[32]; for(int i=0;i<32;i++){ t[i]=(i&3)==3?(int8_t)(4*q+((i&15)>>2)):-128; u[i]=(i&3)==0?(int8_t)(4*q+((i&15)>>2)):-128;} memcpy(&c.take[q],t,32); memcpy(&c.takelo[q],u,32);} c.shift=_mm256_setr_epi32(0,0,0,0,4,4,4,4); c.m4=_mm256_set1_epi8(15); c.magic=_mm256_set1_epi32(0x4B000000); return c;}
#define NCH 128  /* chunks per row: K = 4096 */
#define ROWS 128
/* V0: current */
__attribute__((noinline)) float v0(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    for(int c=0;c<NCH;c++){
      const __m256i raw=_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p+16*c)));
      const __m256i d=_mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw,k->shift),k->m4),_mm256_set1_epi32((int)zr[c]));
      const __m256 sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ __m256 w=_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d,k->take[q])),sv); acc[q]=_mm256_fmadd_ps(_mm256_loadu_ps(a+32*c+8*q),w,acc[q]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }
/* V1: no srlv: xmm shift + insert */
__attribute__((noinline)) float v1(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    for(int c=0;c<NCH;c++){
      const __m128i x=_mm_loadu_si128((const __m128i*)(p+16*c));
      const __m256i raw=_mm256_inserti128_si256(_mm256_castsi128_si256(x),_mm_srli_epi16(x,4),1);
      const __m256i d=_mm256_sub_epi8(_mm256_and_si256(raw,k->m4),_mm256_set1_epi32((int)zr[c]));
      const __m256 sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ __m256 w=_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d,k->take[q])),sv); acc[q]=_mm256_fmadd_ps(_mm256_loadu_ps(a+32*c+8*q),w,acc[q]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }
/* V2: no srlv + magic (no cvt) */
__attribute__((noinline)) float v2(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    for(int c=0;c<NCH;c++){
      const __m128i x=_mm_loadu_si128((const __m128i*)(p+16*c));
      const __m256i nib=_mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(x),_mm_srli_epi16(x,4),1),k->m4);
      const __m256 zv=_mm256_broadcast_ss((const float*)zr+c), sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ __m256 w=_mm256_mul_ps(_mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_shuffle_epi8(nib,k->takelo[q]),k->magic)),zv),sv); acc[q]=_mm256_fmadd_ps(_mm256_loadu_ps(a+32*c+8*q),w,acc[q]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }
/* V3: only loads + fma (bound) */
__attribute__((noinline)) float v3(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    for(int c=0;c<NCH;c++){
      const __m256 sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ acc[q]=_mm256_fmadd_ps(_mm256_loadu_ps(a+32*c+8*q),sv,acc[q]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }

/* V4: current decode, software-pipelined one chunk ahead */
__attribute__((noinline)) float v4(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    __m256 w[4];
#define DEC(c, W) { const __m256i raw=_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p+16*(c)))); \
      const __m256i d=_mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw,k->shift),k->m4),_mm256_set1_epi32((int)zr[c])); \
      const __m256 sv=_mm256_broadcast_ss(sq+(c)); \
      for(int q=0;q<4;q++) W[q]=_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d,k->take[q])),sv); }
    DEC(0, w)
    for(int c=0;c<NCH;c++){
      __m256 wn[4];
      if (c + 1 < NCH) DEC(c+1, wn) else { wn[0]=wn[1]=wn[2]=wn[3]=_mm256_setzero_ps(); }
      for(int q=0;q<4;q++) acc[q]=_mm256_fmadd_ps(_mm256_loadu_ps(a+32*c+8*q),w[q],acc[q]);
      for(int q=0;q<4;q++) w[q]=wn[q];
    }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }
/* V5: two rows interleaved (independent decode streams), the shipped decode */
__attribute__((noinline)) float v5(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r+=2){ __m256 acc[8]; for(int i=0;i<8;i++)acc[i]=_mm256_setzero_ps();
    const uint8_t* p=B+r*NCH*16; const uint8_t* p1=p+NCH*16;
    for(int c=0;c<NCH;c++){
      const __m256i raw=_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p+16*c)));
      const __m256i raw1=_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p1+16*c)));
      const __m256i d=_mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw,k->shift),k->m4),_mm256_set1_epi32((int)zr[c]));
      const __m256i d1=_mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw1,k->shift),k->m4),_mm256_set1_epi32((int)zr[c]));
      const __m256 sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ const __m256 av=_mm256_loadu_ps(a+32*c+8*q);
        __m256 w=_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d,k->take[q])),sv); acc[q]=_mm256_fmadd_ps(av,w,acc[q]);
        __m256 w1=_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d1,k->take[q])),sv); acc[q+4]=_mm256_fmadd_ps(av,w1,acc[q+4]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[6],acc[7])),_mm256_add_ps(_mm256_add_ps(acc[2],acc[3]),_mm256_add_ps(acc[4],acc[5]))); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }

/* va_nomul */
__attribute__((noinline)) float va_nomul(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    for(int c=0;c<NCH;c++){
      const __m256i raw=_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p+16*c)));
      const __m256i d=_mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw,k->shift),k->m4),_mm256_set1_epi32((int)zr[c]));
      const __m256 sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ __m256 w=_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d,k->take[q])); acc[q]=_mm256_fmadd_ps(_mm256_loadu_ps(a+32*c+8*q),w,acc[q]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }
/* vc_noshuf */
__attribute__((noinline)) float vc_noshuf(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    for(int c=0;c<NCH;c++){
      const __m256i raw=_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p+16*c)));
      const __m256i d=_mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw,k->shift),k->m4),_mm256_set1_epi32((int)zr[c]));
      const __m256 sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ __m256 w=_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(d,k->take[q])),sv); acc[q]=_mm256_fmadd_ps(_mm256_loadu_ps(a+32*c+8*q),w,acc[q]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }
/* vd_noaload */
__attribute__((noinline)) float vd_noaload(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    for(int c=0;c<NCH;c++){
      const __m256i raw=_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p+16*c)));
      const __m256i d=_mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw,k->shift),k->m4),_mm256_set1_epi32((int)zr[c]));
      const __m256 sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ __m256 w=_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d,k->take[q])),sv); acc[q]=_mm256_fmadd_ps(sv,w,acc[q]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }
/* ve_only_shuf_cvt */
__attribute__((noinline)) float ve_only_shuf_cvt(const C* k, const uint8_t* B, const uint32_t* zr, const float* sq, const float* a){
  float out=0;
  for(int r=0;r<ROWS;r++){ __m256 acc[4]={_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps(),_mm256_setzero_ps()};
    const uint8_t* p=B+r*NCH*16;
    for(int c=0;c<NCH;c++){
      const __m256i raw=_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p+16*c)));
      const __m256i d=_mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw,k->shift),k->m4),_mm256_set1_epi32((int)zr[c]));
      const __m256 sv=_mm256_broadcast_ss(sq+c);
      for(int q=0;q<4;q++){ __m256 w=_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d,k->take[q])); acc[q]=_mm256_add_ps(w,acc[q]); } }
    __m256 s=_mm256_add_ps(_mm256_add_ps(acc[0],acc[1]),_mm256_add_ps(acc[2],acc[3])); float o[8]; _mm256_storeu_ps(o,s); out+=o[0]+o[7]; }
  return out; }
typedef float (*F)(const C*, const uint8_t*, const uint32_t*, const float*, const float*);
F volatile fs[10]={v0,v1,v2,v3,v4,v5,va_nomul,vc_noshuf,vd_noaload,ve_only_shuf_cvt};
int main(void){ const double ghz = getenv("GHZ") ? atof(getenv("GHZ")) : 2.4; C k=mk(); uint8_t* B=aligned_alloc(64,ROWS*NCH*16); uint32_t* zr=aligned_alloc(64,NCH*8); float* sq=aligned_alloc(64,NCH*8); float* a=aligned_alloc(64,NCH*32*4);
 for(int i=0;i<ROWS*NCH*16;i++)B[i]=rand(); for(int c=0;c<2*NCH;c++){ zr[c]=0x01010101u*(rand()%16); sq[c]=0.001f+(rand()%100)*1e-4f;} for(int i=0;i<NCH*32;i++)a[i]=1.0f/(1+i);
 const char* nm[10]={"as shipped","no vpsrlvd (xmm shift + insert)","no vpsrlvd, no conversion (2^23 + q - (2^23 + z))","FMA and A loads only","software-pipelined one chunk ahead","two rows interleaved","no multiplication by s","no vpshufb","no A loads","vpshufb + conversion + add only"};
 for(int v=0;v<10;v++){ double best=1e9; float s=0; for(int t=0;t<7;t++){ double t0=now(); for(int i=0;i<250;i++) s+=fs[v](&k,B,zr,sq,a); double d=now()-t0; if(d<best)best=d;}
   printf("%-52s %6.2f cycles/chunk (%g)\n",nm[v],best*ghz*1e9/(250.0*ROWS*NCH),s);}
}
