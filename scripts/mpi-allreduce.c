/* MPI_Allreduce benchmark whose table mirrors nccl-tests' all_reduce_perf,
 * so ferrocoll's numbers can be read next to a well-known implementation.
 * It is a comparison tool only: nothing in the crate links against MPI.
 *
 *   mpicc -O2 -o target/mpi-allreduce scripts/mpi-allreduce.c
 *   mpirun -np 4 target/mpi-allreduce -b 4K -e 64M -f 4 -n 20 -w 5
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, nranks;

/* Sizes use 1024-based K/M/G, as nccl-tests does, so "-b 4K" means the same
 * message on both sides of a comparison. */
static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'G': case 'g': v <<= 10; /* fall through */
    case 'M': case 'm': v <<= 10; /* fall through */
    case 'K': case 'k': v <<= 10; end++; break;
    }
    if (end == s || *end != '\0') {
        if (rank == 0) fprintf(stderr, "bad size: %s\n", s);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return (size_t)v;
}

static void fill(float *buf, size_t count, float v) {
    for (size_t i = 0; i < count; i++) buf[i] = v;
}

/* Per-rank count of elements that are not the expected sum. Inputs are small
 * integers, so every summation order gives the exact result and a plain ==
 * is the right test. */
static long count_wrong(const float *buf, size_t count, float want) {
    long wrong = 0;
    for (size_t i = 0; i < count; i++) wrong += buf[i] != want;
    return wrong;
}

/* Times `iters` calls and checks one more on fresh data. Returns the slowest
 * rank's time per call (meaningful on rank 0) and the global wrong count. */
static double run(int in_place, float *send, float *recv, size_t count,
                  int iters, int warmup, long *wrong_out) {
    const void *src = in_place ? MPI_IN_PLACE : send;
    float *dst = in_place ? send : recv;
    fill(send, count, (float)(rank + 1));
    for (int i = 0; i < warmup; i++)
        MPI_Allreduce(src, dst, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

    /* The barrier lines ranks up so a late starter's skew is not billed to
     * the collective; the slowest rank then defines the time, as a job
     * waiting on the result would see it. */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        MPI_Allreduce(src, dst, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / iters, tmax = 0;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    /* Timed in-place calls compound (each sums the previous result), and a
     * stale out-of-place buffer already holds the answer, so check one extra
     * call on a fresh input and a poisoned output. */
    fill(send, count, (float)(rank + 1));
    if (!in_place) fill(recv, count, -1.0f);
    MPI_Allreduce(src, dst, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long wrong = count_wrong(dst, count, (float)nranks * (nranks + 1) / 2);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    *wrong_out = wrong;
    return tmax;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    size_t minb = 4 << 10, maxb = 64 << 20;
    double factor = 4;
    int iters = 20, warmup = 5, opt;
    while ((opt = getopt(argc, argv, "b:e:f:n:w:")) != -1) {
        switch (opt) {
        case 'b': minb = parse_size(optarg); break;
        case 'e': maxb = parse_size(optarg); break;
        case 'f': factor = atof(optarg); break;
        case 'n': iters = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        default:
            if (rank == 0)
                fprintf(stderr, "usage: %s [-b MIN] [-e MAX] [-f FACTOR] "
                                "[-n ITERS] [-w WARMUP]\n", argv[0]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    /* factor <= 1 would never reach -e; counts must fit MPI's int. */
    if (factor <= 1 || iters < 1 || warmup < 0 || minb < sizeof(float) ||
        maxb < minb || maxb / sizeof(float) > 0x7fffffff) {
        if (rank == 0) fprintf(stderr, "bad arguments\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    /* Allocate the largest size once: per-size malloc would put page faults
     * into the first calls of every size. */
    size_t maxcount = maxb / sizeof(float);
    float *send = malloc(maxcount * sizeof(float));
    float *recv = malloc(maxcount * sizeof(float));
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);

    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, "\n")] = '\0';
        printf("# MPI library: %s\n", lib);
        printf("# nranks %d  minBytes %zu  maxBytes %zu  factor %g  iters %d  "
               "warmup %d\n#\n", nranks, minb, maxb, factor, iters, warmup);
        /* Group labels start over the first time(us) column of each half. */
        printf("#%45s%-47s%s\n", "", "out-of-place", "in-place");
        printf("#%11s  %12s  %8s  %6s  %8s  %11s  %11s  %6s  |  %8s  %11s  "
               "%11s  %6s\n", "size", "count", "type", "redop", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)", "#wrong", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }

    long total_wrong = 0;
    double busbw_sum = 0;
    int rows = 0;
    for (double sz = (double)minb; sz <= (double)maxb; sz *= factor) {
        /* Round down to whole floats, as nccl-tests does for its types. */
        size_t count = (size_t)sz / sizeof(float), bytes = count * sizeof(float);
        double t[2], bus[2];
        long wrong[2];
        for (int ip = 0; ip < 2; ip++) {
            t[ip] = run(ip, send, recv, count, iters, warmup, &wrong[ip]);
            double algbw = bytes / t[ip] / 1e9;
            bus[ip] = algbw * 2.0 * (nranks - 1) / nranks;
            busbw_sum += bus[ip];
            total_wrong += wrong[ip];
        }
        rows += 2;
        if (rank == 0)
            printf("%12zu  %12zu  %8s  %6s  %8.1f  %11.2f  %11.2f  %6ld  |  "
                   "%8.1f  %11.2f  %11.2f  %6ld\n", bytes, count, "float",
                   "sum", t[0] * 1e6, bytes / t[0] / 1e9, bus[0], wrong[0],
                   t[1] * 1e6, bytes / t[1] / 1e9, bus[1], wrong[1]);
    }
    if (rank == 0) {
        printf("# Out of bounds values : %ld %s\n", total_wrong,
               total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n#\n", rows ? busbw_sum / rows : 0);
    }

    free(send);
    free(recv);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
