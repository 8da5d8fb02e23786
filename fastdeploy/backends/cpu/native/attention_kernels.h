/*
 * The paged-attention kernels for one KV-cache element type, included by row_kernels.h once per
 * type (so each type is compiled, per instruction set, without a branch in the inner loops).
 * Defines, before including:
 *   KV_NAME    suffix of the entry points (attend_item_d64_<KV_NAME>, ...)
 *   KV_T       the cached element's C type
 *   KV_LOAD(p) LANES cached values from p, widened to a vecf
 *   KV_ONE(p)  one cached value as a float
 *   KV_SCALED  1 when the cache holds int8 with one float scale per position and kv head
 *              ([blocks, kv_heads, block_size], for keys and for values): a key's score and a
 *              value's weight are multiplied by its scale
 * The macros are undefined at the end.
 *
 * Attention work comes in items (struct attn_item): one kv head of one sequence for some of its
 * query tokens. Keys are cached transposed per block ([blocks, kv_heads, head_dim, block_size]),
 * so scores for a run of positions come from broadcasting one query element at a time (vectorised
 * over positions, no horizontal sums). Values are cached [blocks, kv_heads, block_size, head_dim].
 * Each query head takes a softmax (normalised like numpy's) and its probability-weighted values.
 */
#define KV_GLUE2(name, type) name##_##type
#define KV_GLUE(name, type) KV_GLUE2(name, type)
#define KV_FN(name) KV_GLUE(name, KV_NAME)

/* scores[h][c..c+n) for one chunk of positions from `vectors` loads per key row (the vectors that hold
 * the n <= ATTN_CHUNK positions: a sequence's last, partly filled block reads only its filled rows). */
static inline __attribute__((always_inline)) void
KV_FN(score_chunk)(const float *q_scaled, int heads_now, const KV_T *keys_t, const float *key_scales,
                   Py_ssize_t block_size, Py_ssize_t c, Py_ssize_t n, const Py_ssize_t head_dim, float *scores,
                   Py_ssize_t stride, const int vectors)
{
    (void)key_scales;
    vecf acc[ROWS_AT_ONCE][ATTN_CHUNK / LANES] = {{{0}}};
    for (Py_ssize_t d = 0; d < head_dim; d++) {
        const KV_T *row = keys_t + d * block_size + c;
#pragma GCC unroll 4
        for (int i = 0; i < vectors; i++) {
            const vecf keys = KV_LOAD(row + i * LANES);
            for (int h = 0; h < heads_now; h++) acc[h][i] += q_scaled[h * head_dim + d] * keys;
        }
    }
#if KV_SCALED
    for (int i = 0; i < vectors; i++) {
        vecf scale;
        memcpy(&scale, key_scales + c + i * LANES, sizeof(vecf));
        for (int h = 0; h < heads_now; h++) acc[h][i] *= scale;
    }
#endif
    for (int h = 0; h < heads_now; h++) {
        if (n == ATTN_CHUNK) { /* a whole chunk: plain vector stores (a variable-length memcpy is a call) */
            memcpy(scores + h * stride + c, acc[h], sizeof(acc[h]));
            continue;
        }
        float chunk[ATTN_CHUNK];
        memcpy(chunk, acc[h], sizeof(chunk));
        memcpy(scores + h * stride + c, chunk, (size_t)n * sizeof(float));
    }
}

/* scores[h][j] = q_h . key_j for the `count` positions of one cached key block ([head_dim][block_size]);
 * q_scaled [heads_now][head_dim], scores rows `stride` apart; `key_scales` the block's scales. */
static inline __attribute__((always_inline)) void
KV_FN(score_block)(const float *q_scaled, int heads_now, const KV_T *keys_t, const float *key_scales,
                   Py_ssize_t block_size, Py_ssize_t count, const Py_ssize_t head_dim, float *scores, Py_ssize_t stride)
{
    _Static_assert(ATTN_CHUNK / LANES == 4, "score_block dispatches 1 to 4 vectors per chunk");
    if (block_size % ATTN_CHUNK == 0) {
        for (Py_ssize_t c = 0; c < count; c += ATTN_CHUNK) {
            const Py_ssize_t n = count - c < ATTN_CHUNK ? count - c : ATTN_CHUNK;
#define SCORE_CHUNK(v) \
    KV_FN(score_chunk)(q_scaled, heads_now, keys_t, key_scales, block_size, c, n, head_dim, scores, stride, v)
            switch ((n + LANES - 1) / LANES) {
            case 1: SCORE_CHUNK(1); break;
            case 2: SCORE_CHUNK(2); break;
            case 3: SCORE_CHUNK(3); break;
            default: SCORE_CHUNK(4); break;
            }
#undef SCORE_CHUNK
        }
        return;
    }
    for (int h = 0; h < heads_now; h++) {
        float *row_scores = scores + h * stride;
        for (Py_ssize_t j = 0; j < count; j++) row_scores[j] = 0.0f;
        for (Py_ssize_t d = 0; d < head_dim; d++) {
            const float qd = q_scaled[h * head_dim + d];
            const KV_T *row = keys_t + d * block_size;
#pragma omp simd
            for (Py_ssize_t j = 0; j < count; j++) row_scores[j] += qd * KV_ONE(row + j);
        }
#if KV_SCALED
        for (Py_ssize_t j = 0; j < count; j++) row_scores[j] *= key_scales[j];
#endif
    }
}

/* out_h = sum over the first `visible` positions of probs[h][j] * value_j (values cached per block);
 * probs rows `stride` apart, out rows head_dim apart. */
static inline __attribute__((always_inline)) void
KV_FN(weighted_values)(const float *probs, int heads_now, Py_ssize_t stride, Py_ssize_t visible,
                       const KV_T *value_cache, const float *value_scales, const int64_t *table,
                       Py_ssize_t block_size, Py_ssize_t num_kv_heads, Py_ssize_t kv_head, const Py_ssize_t head_dim,
                       float *out)
{
    const Py_ssize_t block_values = head_dim * block_size;
    (void)value_scales;
    if (head_dim % LANES == 0 && head_dim / LANES <= MAX_VECTORS_PER_HEAD) {
        vecf acc[ROWS_AT_ONCE][MAX_VECTORS_PER_HEAD] = {{{0}}};
        for (Py_ssize_t first = 0; first < visible; first += block_size) {
            const Py_ssize_t block = table[first / block_size] * num_kv_heads + kv_head;
            const KV_T *values = value_cache + block * block_values;
            const Py_ssize_t count = visible - first < block_size ? visible - first : block_size;
            for (Py_ssize_t j = 0; j < count; j++) {
                float weight[ROWS_AT_ONCE];
                for (int h = 0; h < heads_now; h++) {
                    weight[h] = probs[h * stride + first + j];
#if KV_SCALED
                    weight[h] *= value_scales[block * block_size + j];
#endif
                }
#pragma GCC unroll 8
                for (int i = 0; i < head_dim / LANES; i++) {
                    const vecf v = KV_LOAD(values + j * head_dim + i * LANES);
                    for (int h = 0; h < heads_now; h++) acc[h][i] += weight[h] * v;
                }
            }
        }
        for (int h = 0; h < heads_now; h++)
            for (int i = 0; i < head_dim / LANES; i++) memcpy(out + h * head_dim + LANES * i, &acc[h][i], sizeof(vecf));
        return;
    }
    for (int h = 0; h < heads_now; h++) {
        float *oh = out + h * head_dim;
        for (Py_ssize_t d = 0; d < head_dim; d++) oh[d] = 0.0f;
        for (Py_ssize_t first = 0; first < visible; first += block_size) {
            const Py_ssize_t block = table[first / block_size] * num_kv_heads + kv_head;
            const KV_T *values = value_cache + block * block_values;
            const Py_ssize_t count = visible - first < block_size ? visible - first : block_size;
            for (Py_ssize_t j = 0; j < count; j++) {
                float p = probs[h * stride + first + j];
#if KV_SCALED
                p *= value_scales[block * block_size + j];
#endif
#pragma omp simd
                for (Py_ssize_t d = 0; d < head_dim; d++) oh[d] += p * KV_ONE(values + j * head_dim + d);
            }
        }
    }
}

/* One token's `heads_now` query heads starting at `offset` (same kv head): scores (soft-capped where
 * `softcap` > 0), softmax, values. */
static inline __attribute__((always_inline)) void
KV_FN(attend_heads)(const float *q, float *out, Py_ssize_t offset, int heads_now, Py_ssize_t visible,
                    const KV_T *key_cache, const KV_T *value_cache, const float *key_scales,
                    const float *value_scales, const int64_t *table, Py_ssize_t block_size, Py_ssize_t num_kv_heads,
                    Py_ssize_t kv_head, const Py_ssize_t head_dim, float scale, float *q_scaled, float *scores,
                    Py_ssize_t stride, Py_ssize_t hidden, float softcap)
{
    for (Py_ssize_t i = 0; i < heads_now * head_dim; i++) q_scaled[i] = q[offset + i] * scale;
    for (Py_ssize_t first = 0; first < visible; first += block_size) {
        const Py_ssize_t block = table[first / block_size] * num_kv_heads + kv_head;
        const Py_ssize_t count = visible - first < block_size ? visible - first : block_size;
        KV_FN(score_block)(q_scaled, heads_now, key_cache + block * head_dim * block_size,
                           key_scales ? key_scales + block * block_size : NULL, block_size, count, head_dim,
                           scores + first, stride);
    }
    if (softcap > 0.0f) softcap_rows(scores, heads_now, stride, visible, softcap);
    /* sliding window: the first `hidden` positions (< block_size, before the window start) */
    for (int h = 0; h < heads_now; h++)
        for (Py_ssize_t j = 0; j < hidden; j++) scores[h * stride + j] = -INFINITY;
    softmax_rows(scores, heads_now, stride, visible);
    KV_FN(weighted_values)(scores, heads_now, stride, visible, value_cache, value_scales, table, block_size,
                           num_kv_heads, kv_head, head_dim, out + offset);
}

/* `scores` holds HEADS_AT_ONCE rows of `stride` floats; `q_scaled` HEADS_AT_ONCE * head_dim. */
static inline __attribute__((always_inline)) void
KV_FN(attend_item)(const struct attn_item *item, const float *q, float *out, const KV_T *key_cache,
                   const KV_T *value_cache, const float *key_scales, const float *value_scales,
                   const int64_t *query_starts, const int64_t *context_lens, const int64_t *block_tables,
                   Py_ssize_t width, Py_ssize_t block_size, Py_ssize_t heads, Py_ssize_t num_kv_heads,
                   const Py_ssize_t head_dim, float scale, float *q_scaled, float *scores, Py_ssize_t stride)
{
    const Py_ssize_t group = heads / num_kv_heads, s = item->seq;
    const int64_t *table = block_tables + s * width;
    /* positions visible to the item's first token; each later token sees one more */
    const Py_ssize_t first_visible = context_lens[s] - (query_starts[s + 1] - item->token0) + 1;
    for (Py_ssize_t t = 0; t < item->tokens; t++) {
        /* sliding window: blocks wholly before the window start are skipped (the table and the
         * positions start at the window's first block), the rest of the positions before it masked */
        const Py_ssize_t start = item->window > 0 && first_visible + t > item->window ? first_visible + t - item->window : 0;
        const Py_ssize_t skipped = start - start % block_size;
        for (Py_ssize_t g = 0; g < group; g += KERNEL_HEADS) {
            const Py_ssize_t offset = (item->token0 + t) * heads * head_dim + (item->kv_head * group + g) * head_dim;
#define ATTEND_HEADS(n)                                                                                         \
    KV_FN(attend_heads)(q, out, offset, n, first_visible + t - skipped, key_cache, value_cache, key_scales,       \
                        value_scales, table + skipped / block_size, block_size, num_kv_heads, item->kv_head,      \
                        head_dim, scale, q_scaled, scores, stride, start - skipped, item->softcap)
            switch (group - g < KERNEL_HEADS ? (int)(group - g) : KERNEL_HEADS) {
            case 1: ATTEND_HEADS(1); break;
#if KERNEL_HEADS >= 2
            case 2: ATTEND_HEADS(2); break;
#endif
#if KERNEL_HEADS >= 3
            case 3: ATTEND_HEADS(3); break;
#endif
#if KERNEL_HEADS >= 4
            case 4: ATTEND_HEADS(4); break;
#endif
            }
#undef ATTEND_HEADS
        }
    }
}

#define ATTEND_PASS(dim)                                                                                      \
    KV_FN(attend_item)(item, q, out, key_cache, value_cache, key_scales, value_scales, query_starts,          \
                       context_lens, block_tables, width, block_size, heads, num_kv_heads, dim, scale, q_scaled, \
                       scores, stride)

/* one copy per common head size, so the compiler unrolls the head_dim loops */
static void KV_FN(attend_item_d64)(ATTEND_ARGS) { (void)head_dim; ATTEND_PASS(64); }
static void KV_FN(attend_item_d128)(ATTEND_ARGS) { (void)head_dim; ATTEND_PASS(128); }
static void KV_FN(attend_item_any)(ATTEND_ARGS) { ATTEND_PASS(head_dim); }

#undef ATTEND_PASS
#undef KV_FN
#undef KV_GLUE
#undef KV_GLUE2
#undef KV_NAME
#undef KV_T
#undef KV_LOAD
#undef KV_ONE
#undef KV_SCALED
