// conv/tile.cu: tile_conv's kernels that stage the weights themselves (an element a copy, runs of taps: wrun), float32
// (_f32) and float64 (_f64), named <epilogue>_k<KS>_to<TO>_<type>: tile_conv (plain), tile_conv_lin (a following
// linear layer), tile_conv_pool (a 2x2 max pooling), and for an input gradient written as the producer's g:
// tile_conv_wgrad, tile_conv_unpool, tile_conv_unpool_wgrad (tile_common.cuh describes each). KS in {3, 5}, TO in
// {4, 8} (and 6 for KS = 5). Layouts: in [N, C, H, W] with image and channel strides in_sn, in_sc; w [O, C, KS, KS];
// out [N, O, Ho, Wo] or, "into" a producer, its g [O, N*Ho*Wo]. tile_arranged.cu has the same kernels for weights
// arranged beforehand: a module of its own, so that their code does not change these kernels' registers and a run
// that arranges no weights does not compile them.
#include "tile_conv.cuh"
#define SUFFIX
#define ARRANGED false
#include "tile_instances.cuh"
