// conv/tile_instances.cuh: the tile_conv kernels of one module, for tile.cu and tile_arranged.cu, which define
// SUFFIX (pasted into each name before its type: empty, or _arr) and ARRANGED (whether the kernels read weights
// arranged beforehand by tile_arrange) before including it: each epilogue (tile_common.cuh) for KS 3 with TO 4
// and 8, and KS 5 with TO 4, 6 and 8, in every element type of the module. Everything it defines, SUFFIX and
// ARRANGED included, is undefined at its end.
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
