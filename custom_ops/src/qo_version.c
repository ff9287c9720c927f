/* Always compiled, whatever backends the library holds: lets loaders check they speak the same ABI. */
#include "qo_kernels.h"

int qo_abi_version(void) { return QO_ABI_VERSION; }
