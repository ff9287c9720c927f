// Does MIGraphX's GPU quantization pass turn a graph's MatMuls into quant_dot? Runs, on the parsed ONNX model, the
// start of the GPU target's required_pipeline (src/targets/gpu/target.cpp, AMDMIGraphX f729a52): normalize_ops,
// dead_code_elimination, eliminate_identity, simplify_qdq{.use_mx_quant = <gfx950>} — the pass that is target
// independent and decides quant_dot (src/simplify_qdq.cpp) — and prints per op name how many instructions remain,
// with 4-input quant_dot (the MX GEMM of match_find_mx_quantizable_ops) counted apart. No GPU needed.
//
//   migraphx_mx_matcher_check MODEL.onnx USE_MX(0|1) [NAME=D0,D1,...]...
// Built and run by tools/migraphx_mx_matcher_check.py against a tools/migraphx_ref.sh build.
#include <migraphx/dead_code_elimination.hpp>
#include <migraphx/eliminate_identity.hpp>
#include <migraphx/instruction.hpp>
#include <migraphx/iterator_for.hpp>
#include <migraphx/module.hpp>
#include <migraphx/normalize_ops.hpp>
#include <migraphx/onnx.hpp>
#include <migraphx/pass_manager.hpp>
#include <migraphx/program.hpp>
#include <migraphx/simplify_qdq.hpp>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

int main(int argc, char** argv)
{
    if(argc < 3)
    {
        std::cerr << "usage: " << argv[0] << " MODEL.onnx USE_MX(0|1) [NAME=D0,D1,...]...\n";
        return 2;
    }
    migraphx::onnx_options opts;
    for(int i = 3; i < argc; ++i)
    {
        std::string arg = argv[i];
        auto eq         = arg.find('=');
        std::vector<std::size_t> dims;
        std::stringstream ss(arg.substr(eq + 1));
        std::string d;
        while(std::getline(ss, d, ','))
            dims.push_back(std::stoul(d));
        opts.map_input_dims[arg.substr(0, eq)] = dims;
    }
    auto prog = migraphx::parse_onnx(argv[1], opts);
    migraphx::simplify_qdq sq;
    sq.use_mx_quant = std::string(argv[2]) == "1";
    migraphx::run_passes(prog,
                         {migraphx::normalize_ops{},
                          migraphx::dead_code_elimination{},
                          migraphx::eliminate_identity{},
                          migraphx::dead_code_elimination{},
                          sq,
                          migraphx::dead_code_elimination{}});
    std::map<std::string, int> counts;
    for(auto* m : prog.get_modules())
        for(auto ins : migraphx::iterator_for(*m))
        {
            auto name = ins->name();
            if(name == "quant_dot" and ins->inputs().size() == 4)
                name = "quant_dot_mx";
            counts[name]++;
        }
    std::cout << "{";
    bool first = true;
    for(const auto& [k, v] : counts)
    {
        std::cout << (first ? "" : ", ") << "\"" << k << "\": " << v;
        first = false;
    }
    std::cout << "}\n";
    return 0;
}
