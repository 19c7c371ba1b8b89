// One thread's load bandwidth over one 1 GB buffer, by two loop shapes and two statistics, in one
// process: what decides the gap between nearlocal's `load` and likwid-bench's load kernels.
//   likwid:    4 x 64-byte loads a trip, values unused (likwid-bench's load_avx512 loop)
//   nearlocal: 4 x 64-byte loads a trip, each xor-ed into one accumulator (kernels/intrinsics.py)
// Each shape runs REPS whole passes, alternating, each pass timed with rdtscp; printed: GB/s from
// the median pass and from the mean pass (likwid's figure is bytes / mean time), and the share of
// the buffer THP backs. How the buffer is got: `touch` (default) faults it page by page with a
// memset, as likwid's first-touch initialisation does; `populate` maps it with MAP_POPULATE (the
// kernel faults it all in one call), as nearlocal's dram region does; `thp` madvises huge pages.
// Build and run: gcc -O2 -mavx512f -o /tmp/load_shapes scripts/load_shapes.c &&
//                /tmp/load_shapes [touch|populate|thp]   (compare_likwid.sh runs all three)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <x86intrin.h>

#define BYTES 1000000000UL
#define REPS 15

static double now_ticks(void) { unsigned aux; return (double)__rdtscp(&aux); }

static void load_unused(const char *p, size_t n) {
    for (size_t i = 0; i < n; i += 256)
        __asm__ volatile("vmovdqa64 (%0), %%zmm0\n\tvmovdqa64 64(%0), %%zmm1\n\t"
                         "vmovdqa64 128(%0), %%zmm2\n\tvmovdqa64 192(%0), %%zmm3"
                         :: "r"(p + i) : "xmm0", "xmm1", "xmm2", "xmm3", "memory");
}

static __m512i load_xor(const char *p, size_t n) {
    __m512i acc = _mm512_setzero_si512();
    for (size_t i = 0; i < n; i += 256) {
        acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i));
        acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 64));
        acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 128));
        acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 192));
    }
    return acc;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double huge_share(const char *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    unsigned long lo, hi, rss = 0, huge = 0, kb;
    int inside = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, ':') != line + strlen(line) - 1)
            inside = (unsigned long)p >= lo && (unsigned long)p < hi;
        else if (inside && sscanf(line, "Rss: %lu kB", &kb) == 1) rss = kb;
        else if (inside && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) huge = kb;
    }
    if (f) fclose(f);
    return rss ? (double)huge / rss : 0.0;
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "touch";
    int thp = !strcmp(how, "thp"), populate = !strcmp(how, "populate");
    size_t len = (BYTES + (2UL << 20)) & ~((2UL << 20) - 1);
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    if (thp) madvise(p, len, MADV_HUGEPAGE);
    memset(p, 1, len);
    double hz0 = now_ticks(), t0; struct timespec ts = {0, 200000000};
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a); nanosleep(&ts, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double hz = (now_ticks() - hz0) / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9);
    double ticks[2][REPS];
    volatile __m512i sink;
    load_unused(p, BYTES); sink = load_xor(p, BYTES);  // warm-up pass of each
    for (int r = 0; r < REPS; r++) {
        t0 = now_ticks(); load_unused(p, BYTES); ticks[0][r] = now_ticks() - t0;
        t0 = now_ticks(); sink = load_xor(p, BYTES); ticks[1][r] = now_ticks() - t0;
    }
    (void)sink;
    const char *names[2] = {"likwid shape (loads unused)", "nearlocal shape (loads xor-ed)"};
    printf("buffer %s, %.0f%% THP\n", how, 100 * huge_share(p));
    for (int s = 0; s < 2; s++) {
        double mean = 0;
        for (int r = 0; r < REPS; r++) mean += ticks[s][r] / REPS;
        qsort(ticks[s], REPS, sizeof(double), by_value);
        printf("%-32s median %6.2f GB/s  mean %6.2f GB/s\n", names[s],
               BYTES / (ticks[s][REPS / 2] / hz) / 1e9, BYTES / (mean / hz) / 1e9);
    }
    return 0;
}
