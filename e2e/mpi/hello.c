/* An MPI hello world and an MPI_Allreduce: each rank says where it runs (its
 * host name, which in a Pinion pod is the member's name, and the CPUs it may
 * run on), then the ranks sum rank+1; the sum must be size*(size+1)/2. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void cpus_allowed(char *out, size_t len) {
    char line[512];
    FILE *f = fopen("/proc/self/status", "r");
    snprintf(out, len, "?");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
            sscanf(line + 18, " %255s", out);
        }
    }
    if (f) {
        fclose(f);
    }
}

int main(int argc, char **argv) {
    int rank, size, mine, sum = 0;
    char host[256], cpus[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    cpus_allowed(cpus, sizeof cpus);
    mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s cpus %s allreduce %d%s\n", rank, size, host, cpus, sum,
           sum == size * (size + 1) / 2 ? " ok" : " WRONG");
    MPI_Finalize();
    return sum == size * (size + 1) / 2 ? 0 : 1;
}
