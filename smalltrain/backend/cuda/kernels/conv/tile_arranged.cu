// conv/tile_arranged.cu: tile_arrange (a convolution's weights in tile_conv's shared-memory layouts, for its forward
// and its input gradient) and tile_conv's kernels that read weights so arranged, staged 16 bytes a copy: the same
// kernels as tile.cu, named with _arr before the type (<epilogue>_k<KS>_to<TO>_arr_<type>), float32 and float64.
#include "tile_conv.cuh"
#define ST_TILE_ARRANGE(T, S)                                                                                      \
    extern "C" __global__ void tile_arrange_##S(const T* w, T* fwd, int fto, T* dx, int dto, int O, int C, int KK) { \
        ST_GRID_WAIT();                                                                                            \
        tile_arrange<T>(w, fwd, fto, dx, dto, O, C, KK);                                                           \
    }
ST_INSTANTIATE(ST_TILE_ARRANGE)
#undef ST_TILE_ARRANGE
#define SUFFIX _arr
#define ARRANGED true
#include "tile_instances.cuh"
