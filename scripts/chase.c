/* The anchor for nearlocal's `chase`: the same walk written in C, timed the plain way.
 * A buffer of SIZE bytes (default 1 GiB), one 64-byte line per ring node, Sattolo's algorithm
 * for one random cycle over every line, each line's first 8 bytes = pointer to the next line.
 * Per round: HOPS dependent loads between two clock_gettime(CLOCK_MONOTONIC) reads; prints the
 * median ns per load over ROUNDS rounds. Usage: chase [size_bytes] [hops] [rounds] [seed]   */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static uint64_t state = 88172645463325252ull;
static uint64_t xorshift(void) { state ^= state << 13; state ^= state >> 7; state ^= state << 17; return state; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static double now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

int main(int argc, char **argv) {
    size_t size = argc > 1 ? strtoull(argv[1], 0, 0) : (1ull << 30);
    long hops = argc > 2 ? atol(argv[2]) : 4000000;
    int rounds = argc > 3 ? atoi(argv[3]) : 15;
    state ^= argc > 4 ? strtoull(argv[4], 0, 0) : 1;
    size_t lines = size / 64;
    char *buf = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buf == MAP_FAILED) { perror("mmap"); return 2; }
    memset(buf, 1, size);
    uint64_t *order = malloc(lines * sizeof *order);
    for (size_t i = 0; i < lines; i++) order[i] = i;
    for (size_t i = lines - 1; i > 0; i--) { size_t j = xorshift() % i; uint64_t t = order[i]; order[i] = order[j]; order[j] = t; }
    for (size_t k = 0; k < lines; k++) *(void **)(buf + order[k] * 64) = buf + order[(k + 1) % lines] * 64;
    free(order);
    void **p = (void **)buf;
    for (size_t i = 0; i < lines && i < (1u << 22); i++) p = (void **)*p;   /* warm-up walk */
    double *ns = malloc(rounds * sizeof *ns);
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (long i = 0; i < hops; i++) p = (void **)*p;
        double t1 = now_ns();
        ns[r] = (t1 - t0) / hops;
    }
    qsort(ns, rounds, sizeof *ns, cmp);
    printf("%.2f %p\n", ns[rounds / 2], (void *)p);   /* p printed: the walk stays live */
    return 0;
}
