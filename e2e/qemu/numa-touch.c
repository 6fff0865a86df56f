/* numa-touch MIB [SECONDS]: allocates MIB MiB of anonymous memory, writes every page,
 * prints "touched" and sleeps SECONDS (default: forever). The QEMU NUMA test reads
 * /proc/PID/numa_maps of this process to see where its pages landed. It exits on
 * SIGTERM: as PID 1 of a container it would otherwise ignore it (no default action for
 * PID 1 in a PID namespace) and every stop would wait for the grace period. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

int main(int argc, char **argv) {
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    if (argc < 2) {
        fprintf(stderr, "usage: numa-touch MIB [SECONDS]\n");
        return 2;
    }
    char *end;
    long mib = strtol(argv[1], &end, 10);
    if (*end != '\0' || mib <= 0 || mib > 65536) {
        fprintf(stderr, "numa-touch: bad size %s (MiB, 1-65536)\n", argv[1]);
        return 2;
    }
    long seconds = argc > 2 ? strtol(argv[2], NULL, 10) : -1;
    size_t len = (size_t)mib << 20;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("numa-touch: mmap");
        return 1;
    }
    long page = sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < len; off += (size_t)page)
        p[off] = (char)off;
    printf("touched %ld MiB\n", mib);
    fflush(stdout);
    if (seconds < 0)
        for (;;)
            pause();
    sleep((unsigned)seconds);
    return 0;
}
