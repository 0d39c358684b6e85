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
ST_INSTANTIATE(ST_TILES)
#undef ST_TILES
#undef ST_TILE
#undef ST_TILE_ONE
#undef ST_TILE_NAMED
#undef ST_TILE_DEF
#undef ST_TILE_ARGS
#undef ST_TILE_PARAMS
#undef SUFFIX
#undef ARRANGED
