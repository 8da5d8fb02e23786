/*
 * Shared declarations of the cpu backend's native kernels (the `_native` extension module).
 *
 * gemm.c              matrix products on GGUF Q4_1/Q8_0 blocks (dequantised in registers) and float32 panels
 * packing.c           GGUF Q4_1/Q8_0 rows repacked into gemm.c's column panels
 * blocks.h            the sub-block panel layout of every other GGUF block type (Q4_0, Q5_*, K-quants, IQ4_*)
 * block_packing.c     GGUF rows of those types repacked into that layout
 * gemm_mixed.c        fused weights whose parts keep different kinds
 * gemm_blocks.c       products on sub-block panels (entry), gemm_blocks.h their kernels, compiled per
 *                     instruction set by gemm_blocks_avx2.c and gemm_blocks_avx512.c
 * gemm_int8.c         the same blocks times int8-quantised activations (FD_CPU_ACTIVATIONS=int8)
 * gemm_w8a8.c         int8 weights with per-channel scales times int8 activations (wint8, FD_CPU_ACTIVATIONS=int8)
 * gemm_bf16.c         bfloat16 weights times activations rounded to bfloat16 (FD_CPU_VISION_MATMUL=bfloat16)
 * encoder_attention_bf16.c  encoder_attention.c's work with bfloat16 products (the same opt-in, AVX512_BF16)
 * row_kernels.h       attention and element-wise kernels, compiled per instruction set by
 *                     row_kernels_avx2.c and row_kernels_avx512.c
 * attention.c         paged causal attention over block tables (entry point)
 * encoder_attention.c bidirectional attention within segments, no cache (vision encoders' entry point)
 * elementwise.c       RMSNorm / LayerNorm (+ residual), SiLU-and-mul, GELUs, rotary embedding (entry points)
 * decoder_layer.c     a decoder layer's attention half and MLP half, one call each, or whole layers in one
 * isa.c               which instruction sets this CPU runs
 * threadpool.c        the parallel loops every kernel runs on (why not OpenMP: see there)
 * module.c            the Python module
 *
 * Every Python-facing function takes the instruction set to run (`isa`: "avx512" or "avx2"),
 * releases the GIL while it computes and splits its work over `threads` threads of threadpool.c.
 */
#ifndef FASTDEPLOY_NATIVE_H
#define FASTDEPLOY_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>


/* e^x for float32, vectorisable (the libm call is not): x = n ln2 + r, |r| <= ln2/2, and
 * e^r by its degree-7 Taylor polynomial (relative error below 2e-8 on that interval). */
static inline __attribute__((always_inline)) float exp_f32(float x)
{
    x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x); /* a vector blend (setup.py: -fno-trapping-math) */
    /* round to nearest by adding and removing 1.5 * 2^23 (vectorises, unlike rintf) */
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f; /* ln2 split in two for accuracy */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; int32_t i; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* fn(ctx, index, slot) for every index in [0, tasks), on up to `threads` threads; `slot` is 0 on the
 * calling thread and 1.. on workers. Returns when every index is done. */
typedef void (*fd_task_fn)(void *ctx, Py_ssize_t index, int slot);
void fd_parallel_for(Py_ssize_t tasks, int threads, fd_task_fn fn, void *ctx);
/* How long waiting threads spin before they sleep. */
void fd_set_spin_ns(long nanoseconds);
long fd_spin_ns(void);
/* Whether loops run on the thread count measured fastest lately (at most the count asked for;
 * thread_adapt.c), and its state: on, the threads of the next loop (0 before any), probes, switches. */
void fd_set_adaptive(int on);
/* What the loops that follow belong to (e.g. a forward pass's token and sequence counts): loops of
 * one kernel and task count cost alike only within one shape. */
void fd_set_step_shape(uint64_t shape);
void fd_adaptive_state(int *adaptive, int *threads, long *probes, long *switches);
/* At least `bytes` of 64-byte aligned memory owned by the calling thread (kept for its next call,
 * freed when it exits); NULL when out of memory. */
void *fd_thread_scratch(size_t bytes);

/* Weight layouts (gemm.c, packing.c): GGUF blocks for float activations, the same blocks for int8
 * activations (gemm_int8.c), float32 panels. */
enum weight_kind {
    KIND_Q4_1 = 0, KIND_Q8_0 = 1, KIND_F32 = 2, KIND_Q4_1_I8 = 3, KIND_Q8_0_I8 = 4,
    /* sub-block panels (blocks.h, gemm_blocks.c) */
    KIND_Q4_0 = 5, KIND_Q5_0 = 6, KIND_Q5_1 = 7, KIND_Q2_K = 8, KIND_Q3_K = 9, KIND_Q4_K = 10, KIND_Q5_K = 11,
    KIND_Q6_K = 12, KIND_IQ4_NL = 13, KIND_IQ4_XS = 14,
    KIND_MIXED = 15, /* parts of different kinds, each in its own layout (gemm_mixed.c) */
    /* the sub-block kinds with int8 activations, on the same panels (gemm_blocks_int8.c), in their order */
    KIND_Q4_0_I8 = 16, KIND_Q6_K_I8 = 23, KIND_IQ4_XS_I8 = 25,
    KIND_MXFP4 = 26, /* a sub-block kind too (after the others so that their numbers stay); no int8 twin */
    KIND_BF16 = 27, /* bfloat16 panels (gemm_bf16.c), activations rounded to bfloat16 */
    KIND_W8A8 = 28, /* int8 levels with a scale per output channel, int8 activations (gemm_w8a8.c) */
    KINDS = 29, /* a weight's kind is below this (what gemm and pack_blocks accept) */
    /* not a weight's kind but the layout of KIND_Q6_K_I8's panels: Q6_K's integers as nibbles and a plane
     * of their two high bits (blocks.h), which its int8 kernels read; the float32 kernels read bytes */
    KIND_Q6_K_NIBBLES = 30
};
/* The sub-block layout whose panels a kind reads: an _I8 sub-block kind's float32 twin (Q6_K_I8:
 * KIND_Q6_K_NIBBLES), else itself. */
static inline int is_int8_subblock_kind(int kind) { return kind >= KIND_Q4_0_I8 && kind <= KIND_IQ4_XS_I8; }
static inline int subblock_layout(int kind)
{
    if (kind == KIND_Q6_K_I8) return KIND_Q6_K_NIBBLES;
    return is_int8_subblock_kind(kind) ? kind - (KIND_Q4_0_I8 - KIND_Q4_0) : kind;
}
enum isa { ISA_NONE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* The widest instruction set this CPU runs; the name of one; a name's value, or -1 with a Python
 * ValueError set when it is unknown or wider than the CPU runs. */
int native_cpu_isa(void);
const char *native_isa_name(int isa);
int native_isa_checked(const char *name);

/* Up to HEADS_AT_ONCE query heads of one kv group go through each key and value row together:
 * the row is loaded once, and their accumulators are independent chains that keep the FMA units
 * busy (the row kernels may take fewer at once; scratch buffers are sized for this many). */
#define HEADS_AT_ONCE 4

/* One attention work item: one kv head of one sequence for `tokens` of its query tokens. */
struct attn_item {
    Py_ssize_t seq, kv_head, token0, tokens;
    Py_ssize_t window; /* > 0: each query sees only its last `window` positions (sliding window) */
    float softcap;     /* > 0: scores become softcap * tanh(score / softcap) before the softmax */
};

/* KV-cache element types (`kv_cache_dtype`): int8 comes with a float scale per position and kv head. */
enum kv_type { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2, KV_I8 = 3, KV_TYPES = 4 };

#define ATTEND_ARGS                                                                                               \
    const struct attn_item *item, const float *q, float *out, const void *key_cache, const void *value_cache,     \
        const float *key_scales, const float *value_scales, const int64_t *query_starts,                          \
        const int64_t *context_lens, const int64_t *block_tables, Py_ssize_t width, Py_ssize_t block_size,        \
        Py_ssize_t heads, Py_ssize_t num_kv_heads, Py_ssize_t head_dim, float scale, float *q_scaled, float *scores, \
        Py_ssize_t stride

/* One paged-attention call (attention.c): the step's keys and values written into the cache, then
 * causal attention of each sequence's query rows over its blocks. q/out [tokens, heads, head_dim];
 * token t's k row ([kv_heads, head_dim]) starts k_stride floats after token t-1's, its v row v_stride
 * floats after (the fused layer reads v in place from its qkv rows); the caches
 * and batch arrays as `attention` (module.c) documents them; cache_bytes/scale_bytes the key cache's and
 * key scales' sizes (the value cache's are the same). */
struct paged_attention {
    const float *q, *k, *v;
    Py_ssize_t k_stride, v_stride;
    float *out;
    void *key_cache, *value_cache;
    float *key_scales, *value_scales;
    Py_ssize_t cache_bytes, scale_bytes;
    const int64_t *slot_mapping, *query_starts, *context_lens, *block_tables;
    Py_ssize_t seqs, tokens, heads, kv_heads, head_dim, block_size, width;
    float scale;
    int kv_type;
    Py_ssize_t window; /* > 0: sliding-window attention over each query's last `window` positions */
    float softcap;     /* > 0: attention logit soft-capping, softcap * tanh(score / softcap) (Gemma 2) */
};
struct attention_job;
struct row_kernels;
/* Checks the call against its cache and splits it into work items (with the GIL: NULL with a Python
 * error set when the call is inconsistent); runs it (without the GIL: -1 when out of memory); frees it. */
struct attention_job *paged_attention_plan(const struct paged_attention *call, const struct row_kernels *kernels);
int paged_attention_run(struct attention_job *job, int threads);
void paged_attention_free(struct attention_job *job);

/* Up to ENCODER_ROWS_AT_ONCE query rows of one head go through each key and value row together in the
 * encoder kernels (the row kernels take fewer at once where registers are fewer). */
#define ENCODER_ROWS_AT_ONCE 6

/* Bidirectional attention of `tokens` query rows of one head over one segment's `count` keys, laid out
 * by encoder_attention.c: keys_t [head_dim][padded], values [padded][head_dim]; q/out rows `row_stride`
 * floats apart; scratch holds ENCODER_ROWS_AT_ONCE * (2 * head_dim + padded) floats. */
#define ENCODER_ARGS                                                                                          \
    const float *q, float *out, Py_ssize_t tokens, Py_ssize_t row_stride, const float *keys_t,                \
        const float *values, Py_ssize_t padded, Py_ssize_t count, Py_ssize_t head_dim, float scale, float *scratch

/* Encoder attention's work (encoder_attention.c, encoder_attention_bf16.c): items of up to ENCODER_TILE
 * query tokens of one head of one segment; each segment's first element in the laid-out keys (and
 * values), `per_key` elements per padded key and head; the longest padded segment. */
#define ENCODER_TILE 48 /* a multiple of both kernels' rows at once */
struct encoder_item {
    Py_ssize_t segment, head, token0, tokens;
};
struct encoder_plan {
    struct encoder_item *items;
    Py_ssize_t *offsets;
    Py_ssize_t count, laid_out, longest;
};
/* Encoder attention's inputs: q, k and v rows of `stride` floats (three arrays, or one fused qkv
 * projection read in place), and optional rotate-half rotary tables for q and k (a vision tower's 2-D
 * positions), applied by one pass over the tokens before the keys are laid out. */
typedef void (*rotary_fn)(const float *x, float *out, const float *cos_row, const float *sin_row, Py_ssize_t heads,
                          Py_ssize_t head_dim, Py_ssize_t half);
struct encoder_input {
    Py_buffer q, k, v, cos, sin; /* cos.obj NULL: no rotary */
    const float *q0, *k0, *v0;   /* token 0, head 0 of each */
    Py_ssize_t stride, half, width; /* floats from one token's row to the next; cos/sin row length; heads x head_dim */
    rotary_fn rotary;
    /* [tokens][width]: q rotated, or gathered from rows wider than that (NULL: q itself); k rotated (NULL: k) */
    float *queries, *keys;
};
/* Gets q/k/v (each `offsets[i]` floats into its buffer) and cos/sin (None, or [tokens][half] float32) and
 * checks them against the shapes; 0, or -1 with an error set (encoder_input_release in either case). */
int encoder_input_get(struct encoder_input *in, PyObject *const objects[5], const Py_ssize_t offsets[3],
                      Py_ssize_t stride, Py_ssize_t tokens, Py_ssize_t heads, Py_ssize_t head_dim, rotary_fn rotary,
                      const char *name);
void encoder_input_release(struct encoder_input *in);
/* Fills in->queries and in->keys where they are used, on `threads` threads (no GIL needed). */
void encoder_input_prepare(struct encoder_input *in, Py_ssize_t tokens, Py_ssize_t head_dim, int threads);
/* The query rows the kernels read, width floats apart, and key row (token t, head h). */
static inline const float *encoder_query_rows(const struct encoder_input *in) { return in->queries ? in->queries : in->q0; }
static inline const float *encoder_key_row(const struct encoder_input *in, Py_ssize_t t, Py_ssize_t h,
                                           Py_ssize_t head_dim)
{
    return in->keys ? in->keys + t * in->width + h * head_dim : in->k0 + t * in->stride + h * head_dim;
}

/* Whether cu_seqlens `starts` ([segments + 1]) runs 0 .. tokens ascending. */
int encoder_segments_valid(const int64_t *starts, Py_ssize_t segments, Py_ssize_t tokens);
/* Fills `plan` for segments padded to `padded_length(count)` keys; -1 when out of memory (no error set).
 * encoder_plan_free releases what it holds (also after a failure). */
int encoder_plan_build(struct encoder_plan *plan, const int64_t *starts, Py_ssize_t segments, Py_ssize_t heads,
                       Py_ssize_t per_key, Py_ssize_t (*padded_length)(Py_ssize_t));
void encoder_plan_free(struct encoder_plan *plan);

/* Element-wise activations of the `activation` entry point (vision encoders' MLPs). */
enum activation { ACT_QUICK_GELU = 0, ACT_GELU_ERF = 1, ACTIVATIONS = 2 };

/* The attention and element-wise kernels of one instruction set (row_kernels.h). */
struct row_kernels {
    /* [kv type][head_dim 64, head_dim 128, any head_dim] */
    void (*attend[KV_TYPES][3])(ATTEND_ARGS);
    void (*rms_norm_row)(const float *x, const float *residual, const float *weight, float *out, float *sum_out,
                         Py_ssize_t cols, float eps);
    void (*silu_mul_row)(const float *x, float *out, Py_ssize_t half);
    void (*rotary_row)(const float *x, float *out, const float *cos_row, const float *sin_row, Py_ssize_t heads,
                       Py_ssize_t head_dim, Py_ssize_t half);
    void (*encoder_attend_d64)(ENCODER_ARGS);
    void (*encoder_attend_any)(ENCODER_ARGS);
    void (*layer_norm_row)(const float *x, const float *residual, const float *weight, const float *bias, float *out,
                           float *sum_out, Py_ssize_t cols, float eps);
    void (*activation_row[ACTIVATIONS])(const float *x, float *out, Py_ssize_t cols);
};
extern const struct row_kernels row_kernels_avx2, row_kernels_avx512;
/* The kernels for an instruction set named by Python, or NULL with a ValueError set. */
const struct row_kernels *native_row_kernels(const char *isa_name);
#define PANEL 16 /* output columns per weight panel */

/* Arguments of one product out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) (gemm.c, gemm_int8.c). */
struct gemm_args {
    const float *x;
    const uint8_t *packed;
    float *out;
    Py_ssize_t rows, cols, depth;
    int kind;
    const float *bias; /* NULL: none; else added to each row as the tile is stored */
    const float *block_sums; /* fd_gemm's own: Q4_1's per-row sums of each 32 activations */
    /* KIND_BF16 only, or NULL: x already rounded (fd_bf16_round_row), fd_bf16_row_pairs(depth) pairs a
     * row */
    const uint16_t *x_bf16;
    /* the int8 kinds only, or NULL: x already quantised there (fd_int8_quantize_rows) */
    void *x_int8;
};
/* gemm.c: the product for any weight kind on the caller's threads (the GIL released); -1 when out of
 * memory. The bytes of a packed [cols, depth] weight of `kind`. */
int fd_gemm(const struct gemm_args *a, int isa, int threads);
Py_ssize_t fd_packed_bytes(int kind, Py_ssize_t cols, Py_ssize_t depth);
/* gemm_int8.c: the product for the KIND_Q8_0_I8 / KIND_Q4_1_I8 layouts, activations quantised to
 * int8 (with the caller's threads; the GIL released); -1 when out of memory. fd_gemm sends them to
 * gemm_blocks_int8, which hands products of up to 4 rows to this one. */
int gemm_int8(const struct gemm_args *a, int isa, int threads);
/* gemm_w8a8.c: the product for KIND_W8A8 (same threads, GIL, errors); the bytes of its packed weight. */
int fd_gemm_w8a8(const struct gemm_args *a, int isa, int threads);
Py_ssize_t fd_w8a8_packed_bytes(Py_ssize_t cols, Py_ssize_t depth);
/* gemm_blocks.c: the product for the sub-block kinds (KIND_Q4_0 .. KIND_IQ4_XS and KIND_MXFP4, blocks.h), on the
 * caller's threads (the GIL released); -1 when out of memory. */
int gemm_blocks(const struct gemm_args *a, int isa, int threads);
/* gemm_blocks_int8.c: the product for KIND_Q4_0_I8 .. KIND_IQ4_XS_I8, KIND_Q8_0_I8 and KIND_Q4_1_I8
 * (same threads, GIL, errors). */
int gemm_blocks_int8(const struct gemm_args *a, int isa, int threads);
/* The bytes of `a`'s activations quantised ahead of the product (as the step before it produces
 * them, while they are in cache), or 0 where the product does not take them (no int8 kind, or few
 * rows); fd_int8_quantize_rows fills rows [first, end) of them from a->x, for a->x_int8. */
size_t fd_int8_rows_bytes(const struct gemm_args *a);
void fd_int8_quantize_rows(const struct gemm_args *a, int isa, void *memory, Py_ssize_t first, Py_ssize_t end);
/* The dot instructions gemm_blocks_int8 uses for `isa` here: 0 AVX2's maddubs, 1 AVX-VNNI, 2 AVX-512
 * VNNI; `widest` in 0..2 caps them from then on (tests reach the narrower ones), else ignored. */
int fd_int8_dots(int isa, int widest);
/* gemm_int8.c: rows first..end-1 of x [rows, depth] quantised per 32 values: q (int8), each
 * block's scale and sum of q ([rows, depth / 32]). */
void fd_quantize_rows(const float *x, Py_ssize_t first, Py_ssize_t end, Py_ssize_t depth, int8_t *q, float *scale,
                      int32_t *sum);
/* gemm_mixed.c: whether `packed` (len bytes) holds a [cols, depth] weight of `kind` (any kind,
 * KIND_MIXED's header included); the product of a KIND_MIXED weight (-1 when out of memory). */
#define MIXED_HEADER_BYTES 128
#define MIXED_MAX_SEGMENTS 4
int fd_packed_valid(int kind, const uint8_t *packed, Py_ssize_t len, Py_ssize_t cols, Py_ssize_t depth);
int gemm_mixed(const struct gemm_args *a, int isa, int threads);
/* block_packing.c: GGUF rows [out_features][in_features / weights per block * block bytes] of a
 * sub-block kind repacked into its panels (`out` has fd_packed_bytes); 0, or -1 on a bad shape. */
int pack_subblock_rows(int kind, const uint8_t *rows, Py_ssize_t rows_len, uint8_t *out, Py_ssize_t out_len,
                       Py_ssize_t out_features, Py_ssize_t in_features);
/* Whether the AVX-512 kernels have AVX-512 VNNI here (the int8 products' widest dots: fd_int8_dots). */
int native_cpu_has_vnni(void);

PyObject *native_best_isa(PyObject *self, PyObject *noargs);
PyObject *native_gemm(PyObject *self, PyObject *args);
PyObject *native_pack_blocks(PyObject *self, PyObject *args);
PyObject *native_packed_bytes(PyObject *self, PyObject *args);
PyObject *native_shm_collective(PyObject *self, PyObject *args);
PyObject *native_attention(PyObject *self, PyObject *args);
PyObject *native_attention_sink_factors(PyObject *self, PyObject *args);
PyObject *native_encoder_attention(PyObject *self, PyObject *args);
PyObject *native_rms_norm(PyObject *self, PyObject *args);
PyObject *native_attention_block(PyObject *self, PyObject *args);
PyObject *native_mlp_block(PyObject *self, PyObject *args);
PyObject *native_decoder_stack_prepare(PyObject *self, PyObject *layers);
PyObject *native_decoder_stack(PyObject *self, PyObject *args);
PyObject *native_layer_norm(PyObject *self, PyObject *args);
PyObject *native_activation(PyObject *self, PyObject *args);
PyObject *native_silu_and_mul(PyObject *self, PyObject *args);
PyObject *native_rotary(PyObject *self, PyObject *args);
/* gemm_bf16.c: whether vdpbf16ps runs here (else bfloat16 is widened to float32), rounding, the product */
int native_cpu_has_bf16(void);
PyObject *native_has_bf16(PyObject *self, PyObject *noargs);
PyObject *native_round_bf16(PyObject *self, PyObject *args);
PyObject *native_gemm_bf16(PyObject *self, PyObject *args);
/* gemm_bf16.c: the product of a KIND_BF16 weight (fd_gemm's; -1 when out of memory) and its packed
 * bytes */
int fd_gemm_bf16(const struct gemm_args *a, int isa, int threads);
Py_ssize_t fd_bf16_packed_bytes(Py_ssize_t cols, Py_ssize_t depth);
/* The rounded activations a KIND_BF16 product reads: a row of `depth` values rounded (its odd
 * depth's pad zeroed), and the 32-bit pairs from one row to the next. */
void fd_bf16_round_row(const float *x, uint16_t *out, Py_ssize_t depth);
Py_ssize_t fd_bf16_row_pairs(Py_ssize_t depth);
PyObject *native_encoder_attention_bf16(PyObject *self, PyObject *args);

#endif
