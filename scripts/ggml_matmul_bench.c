// llama.cpp's side of bench/quant_matmul.py: matmuls y = x W^T through ggml's CPU backend,
// timed. W [N, K] of a ggml type, its rows read from WEIGHTS (the bytes bench/quant_matmul.py
// gives our side too), placed in the CPU backend's repacking buffer where it takes the
// matrix (as llama-server's loader places weights), else in a plain one; x [M, K] float32
// (ggml converts it to the type's activation format inside the op, as our side quantizes
// its activations). Prints one JSON line per M: {"type", "n", "k", "m", "repacked": 0|1,
// "calls", "us": the median microseconds of a call}, each M timed for about SECONDS.
//
// Build (bench/quant_matmul.py does it): cc -O2 scripts/ggml_matmul_bench.c -I<ggml>/include
// -L<build>/bin -lggml -lggml-base -lggml-cpu -lm -Wl,-rpath,<build>/bin
// Usage: ggml_matmul_bench TYPE_ID N K THREADS SECONDS WEIGHTS M [M ...]

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static float randn(unsigned *s) {  // Box-Muller on a small LCG: values only need a spread
    *s = *s * 1664525u + 1013904223u;
    float u1 = ((*s >> 8) + 1.0f) / 16777217.0f;
    *s = *s * 1664525u + 1013904223u;
    float u2 = (*s >> 8) / 16777216.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// One M: x [M, K] random, the graph built on w, warmed, then timed for budget_us.
static void run_m(ggml_backend_t backend, ggml_backend_dev_t dev, struct ggml_tensor *w,
                  int repacked, int64_t M, double budget_us, unsigned *seed) {
    const int64_t K = w->ne[0], N = w->ne[1];
    struct ggml_init_params xp = {ggml_tensor_overhead() * 4, NULL, true};
    struct ggml_context *cx = ggml_init(xp);
    struct ggml_tensor *x = ggml_new_tensor_2d(cx, GGML_TYPE_F32, K, M);
    struct ggml_tensor *y = ggml_mul_mat(cx, w, x);
    (void)dev;
    ggml_backend_buffer_t xbuf =
        ggml_backend_alloc_ctx_tensors_from_buft(cx, ggml_backend_cpu_buffer_type());
    float *xs = malloc(sizeof(float) * (size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) xs[i] = randn(seed);
    ggml_backend_tensor_set(x, xs, 0, ggml_nbytes(x));
    struct ggml_init_params gp = {ggml_graph_overhead() + ggml_tensor_overhead(), NULL, true};
    struct ggml_context *cg = ggml_init(gp);
    struct ggml_cgraph *gf = ggml_new_graph(cg);
    ggml_build_forward_expand(gf, y);
    ggml_backend_graph_compute(backend, gf);  // warm
    static double times[4096];
    int n = 0;
    const double t_end = now_us() + budget_us;
    while (n < 4096 && (n < 3 || now_us() < t_end)) {
        double t0 = now_us();
        ggml_backend_graph_compute(backend, gf);
        times[n++] = now_us() - t0;
    }
    qsort(times, (size_t)n, sizeof(double), cmp);
    printf("{\"type\": \"%s\", \"n\": %lld, \"k\": %lld, \"m\": %lld, \"repacked\": %d, "
           "\"calls\": %d, \"us\": %.2f}\n",
           ggml_type_name(w->type), (long long)N, (long long)K, (long long)M, repacked, n,
           times[n / 2]);
    fflush(stdout);
    ggml_backend_buffer_free(xbuf);
    ggml_free(cg);
    ggml_free(cx);
    free(xs);
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s TYPE_ID N K THREADS SECONDS WEIGHTS M [M ...]\n", argv[0]);
        return 2;
    }
    const enum ggml_type type = (enum ggml_type)atoi(argv[1]);
    const int64_t N = atoll(argv[2]), K = atoll(argv[3]);
    const int threads = atoi(argv[4]);
    const double budget_us = atof(argv[5]) * 1e6;
    unsigned seed = 1234;

    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, threads);
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
            reg, "ggml_backend_dev_get_extra_bufts");

    struct ggml_init_params wp = {ggml_tensor_overhead() * 4, NULL, true};
    struct ggml_context *cw = ggml_init(wp);
    struct ggml_tensor *w = ggml_new_tensor_2d(cw, type, K, N);
    struct ggml_context *cp = ggml_init(wp);  // the probe: does the backend take w repacked?
    struct ggml_tensor *probe = ggml_mul_mat(cp, w, ggml_new_tensor_2d(cp, GGML_TYPE_F32, K, 4));

    // the repacking buffer where the backend takes this matrix there (llama.cpp's loader asks
    // the same question per weight), else a plain CPU buffer
    ggml_backend_buffer_t wbuf = NULL;
    int repacked = 0;
    if (get_extra != NULL) {
        for (ggml_backend_buffer_type_t *b = get_extra(dev); b && *b; b++) {
            wbuf = ggml_backend_alloc_ctx_tensors_from_buft(cw, *b);
            if (wbuf != NULL && ggml_backend_dev_supports_op(dev, probe)) {
                repacked = 1;
                break;
            }
            if (wbuf != NULL) ggml_backend_buffer_free(wbuf);
            wbuf = NULL;
            w->buffer = NULL, w->data = NULL, w->extra = NULL;
        }
    }
    if (wbuf == NULL)
        wbuf = ggml_backend_alloc_ctx_tensors_from_buft(cw, ggml_backend_cpu_buffer_type());

    const size_t nbytes = ggml_nbytes(w);
    void *q = malloc(nbytes);
    FILE *f = fopen(argv[6], "rb");
    if (f == NULL || fread(q, 1, nbytes, f) != nbytes) {
        fprintf(stderr, "%s: cannot read %zu bytes of weights\n", argv[6], nbytes);
        return 1;
    }
    fclose(f);
    ggml_backend_tensor_set(w, q, 0, nbytes);
    for (int i = 7; i < argc; i++) run_m(backend, dev, w, repacked, atoll(argv[i]), budget_us, &seed);
    ggml_backend_buffer_free(wbuf);
    ggml_free(cp);
    ggml_free(cw);
    ggml_backend_free(backend);
    free(q);
    return 0;
}
