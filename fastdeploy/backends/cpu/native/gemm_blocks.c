/*
 * Entry of the products on sub-block panels (blocks.h): the sub-block sums of the activations
 * that the minimums fold in, computed once per product in one fixed order, then tasks of panels
 * (a pair; four for one row) on the thread pool, each run by the kernels of the instruction set
 * asked for (gemm_blocks.h, compiled per set).
 */
#include "blocks.h"

#include <immintrin.h>

void gemm_blocks_task_avx512(const struct gemm_args *a, const float *xsums, Py_ssize_t first, Py_ssize_t end);
void gemm_blocks_task_avx2(const struct gemm_args *a, const float *xsums, Py_ssize_t first, Py_ssize_t end);

#define PREFETCH_GROUPS 2

struct blocks_job {
    const struct gemm_args *a;
    const float *xsums;
    Py_ssize_t panels;
    int isa, per_task;
};

static void blocks_task(void *ctx, Py_ssize_t task, int slot)
{
    const struct blocks_job *job = ctx;
    const struct gemm_args *a = job->a;
    const Py_ssize_t first = task * job->per_task;
    const Py_ssize_t end = first + job->per_task < job->panels ? first + job->per_task : job->panels;
    /* the next task's first groups (as gemm.c's prefetch_panels: the kernels prefetch within a panel),
     * into L2: a burst of some 44 prefetches into L1 waited on its miss buffers at every task's start,
     * which the compute-bound AVX2 one-row product could not hide (perf: 4% of an AVX2 decode on that
     * one instruction; a step of the ERNIE-shaped Q4_K_M and Q6_K products 1.15-1.2x faster with T1,
     * AVX-512 the same, and without the prefetch AVX-512 was 4% slower) */
    const Py_ssize_t gbytes = group_bytes(a->kind), panel_bytes = a->depth / GROUP * gbytes;
    for (Py_ssize_t p = end; p < end + job->per_task && p < job->panels; p++)
        for (Py_ssize_t line = 0; line < PREFETCH_GROUPS * gbytes; line += 64)
            _mm_prefetch((const char *)a->packed + p * panel_bytes + line, _MM_HINT_T1);
    if (job->isa == ISA_AVX512)
        gemm_blocks_task_avx512(a, job->xsums, first, end);
    else
        gemm_blocks_task_avx2(a, job->xsums, first, end);
    (void)slot;
}

/* Each `sub` consecutive activations' sum, rows first .. end - 1, in one order (AVX2 code, which
 * AVX-512 machines run too): every kernel folds the same value into the minimums' term. */
static __attribute__((target("avx2,fma"))) void sub_sums_rows(const float *x, Py_ssize_t first, Py_ssize_t end,
                                                             Py_ssize_t depth, int sub, float *sums)
{
    const Py_ssize_t count = depth / sub;
    for (Py_ssize_t r = first; r < end; r++)
        for (Py_ssize_t b = 0; b < count; b++) {
            const float *v = x + r * depth + b * sub;
            __m256 s = _mm256_add_ps(_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8));
            if (sub == 32)
                s = _mm256_add_ps(s, _mm256_add_ps(_mm256_loadu_ps(v + 16), _mm256_loadu_ps(v + 24)));
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            sums[r * count + b] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
}

#define SUM_ROWS_PER_TASK 16
#define SUMS_ON_STACK 2048

struct sums_job {
    const struct gemm_args *a;
    float *sums;
};

static void sums_task(void *ctx, Py_ssize_t index, int slot)
{
    const struct sums_job *job = ctx;
    const Py_ssize_t first = index * SUM_ROWS_PER_TASK, rows = job->a->rows;
    const Py_ssize_t end = first + SUM_ROWS_PER_TASK < rows ? first + SUM_ROWS_PER_TASK : rows;
    sub_sums_rows(job->a->x, first, end, job->a->depth, block_sub(job->a->kind), job->sums);
    (void)slot;
}

int gemm_blocks(const struct gemm_args *a, int isa, int threads)
{
    const Py_ssize_t panels = (a->cols + PANEL - 1) / PANEL;
    float on_stack[SUMS_ON_STACK], *sums = NULL;
    if (block_has_min(a->kind)) {
        const Py_ssize_t count = a->rows * (a->depth / block_sub(a->kind));
        sums = count <= SUMS_ON_STACK ? on_stack : PyMem_RawMalloc((size_t)count * sizeof(float));
        if (sums == NULL) return -1;
        struct sums_job sj = {a, sums};
        if (a->rows <= SUM_ROWS_PER_TASK)
            sums_task(&sj, 0, 0);
        else
            fd_parallel_for((a->rows + SUM_ROWS_PER_TASK - 1) / SUM_ROWS_PER_TASK, threads, sums_task, &sj);
    }
    struct blocks_job job = {a, sums, panels, isa, a->rows == 1 ? 4 : 2};
    fd_parallel_for((panels + job.per_task - 1) / job.per_task, threads, blocks_task, &job);
    if (sums != on_stack) PyMem_RawFree(sums);
    return 0;
}
