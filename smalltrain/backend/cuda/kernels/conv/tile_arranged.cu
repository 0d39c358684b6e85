// conv/tile_arranged.cu: tile_arrange (a convolution's weights in tile_conv's shared-memory layouts, for its forward
// and its input gradient) and tile_conv's kernels that read weights so arranged, staged 16 bytes a copy: the same
// kernels as tile.cu, named with _arr before the type (<epilogue>_k<KS>_to<TO>_arr_<type>), float32 and float64.
#include "tile_conv.cuh"
#define SUFFIX _arr
#define ARRANGED true
#define ST_TILE_ARRANGE(T, S)                                                                                      \
    extern "C" __global__ void tile_arrange_##S(const T* w, T* fwd, int fto, T* dx, int dto, int O, int C, int KK) { \
        ST_GRID_WAIT();                                                                                            \
        tile_arrange<T>(w, fwd, fto, dx, dto, O, C, KK);                                                           \
    }

#define ST_TILE_PARAMS(T)                                                                                          \
    const T *in, const T *w, const T *b, T *out, T *y, int N, int C, int Hi, int Wi, int in_sn, int in_sc, int O,    \
        int Ho, int Wo, int pt, int pl, int TH, int CS, int transposed, int into, int act, const T *lw, const T *lb, \
        T *lout, T *lpart, unsigned *lcount, int F, i64 *pidx, const T *px, int pH, int pW, int ppt, int ppl,        \
        T *wpart, int vstage, int wrun
#define ST_TILE_ARGS                                                                                               \
    in, w, b, out, y, N, C, Hi, Wi, in_sn, in_sc, O, Ho, Wo, pt, pl, TH, CS, transposed, into, act, lw, lb, lout,  \
        lpart, lcount, F, pidx, px, pH, pW, ppt, ppl, wpart, vstage, wrun
// (SUFFIX passes through one macro that expands it before ST_TILE_DEF pastes it into the name)
#define ST_TILE_ONE(T, S, KS, TO, NAME, EPI) ST_TILE_NAMED(T, S, KS, TO, NAME, EPI, SUFFIX)
#define ST_TILE_NAMED(T, S, KS, TO, NAME, EPI, SUF) ST_TILE_DEF(T, S, KS, TO, NAME, EPI, SUF)
#define ST_TILE_DEF(T, S, KS, TO, NAME, EPI, SUF)                                                                  \
    extern "C" __global__ void NAME##_k##KS##_to##TO##SUF##_##S(ST_TILE_PARAMS(T)) {                               \
        ST_GRID_WAIT();                                                                                            \
        tile_conv<T, KS, TO, EPI, ARRANGED>(ST_TILE_ARGS);                                                         \
    }
#define ST_TILE(T, S, KS, TO)                                                                                      \
    ST_TILE_ONE(T, S, KS, TO, tile_conv, ST_EPI_PLAIN)                                                             \
    ST_TILE_ONE(T, S, KS, TO, tile_conv_lin, ST_EPI_LINEAR)                                                        \
    ST_TILE_ONE(T, S, KS, TO, tile_conv_pool, ST_EPI_POOL)                                                         \
    ST_TILE_ONE(T, S, KS, TO, tile_conv_wgrad, ST_EPI_WGRAD)                                                       \
    ST_TILE_ONE(T, S, KS, TO, tile_conv_unpool, ST_EPI_UNPOOL)                                                     \
    ST_TILE_ONE(T, S, KS, TO, tile_conv_unpool_wgrad, ST_EPI_UNPOOL_WGRAD)
#define ST_TILES(T, S)                                                                                             \
    ST_TILE(T, S, 3, 4) ST_TILE(T, S, 3, 8) ST_TILE(T, S, 5, 4) ST_TILE(T, S, 5, 6) ST_TILE(T, S, 5, 8)
ST_INSTANTIATE(ST_TILE_ARRANGE)
ST_INSTANTIATE(ST_TILES)
#undef ST_TILE_ARRANGE
#undef ST_TILES
#undef ST_TILE
#undef ST_TILE_ONE
#undef ST_TILE_NAMED
#undef ST_TILE_DEF
#undef ST_TILE_ARGS
#undef ST_TILE_PARAMS
#undef SUFFIX
#undef ARRANGED
