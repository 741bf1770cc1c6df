// FlashMLA's dense MLA decode alone, for the benchmark peer (benchmarks/flashmla_peer.py):
// FlashMLA's own binding (csrc/api/api.cpp) also binds its sparse and sm100 kernels.
#include <pybind11/pybind11.h>

#include "api/dense_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("dense_decode_fwd", &dense_attn_decode_interface);
}
