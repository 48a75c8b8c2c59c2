/* `nmeter` for the node e2e suite's images, whose specs read the time with milliseconds as
 * `nmeter -d0 '%3t' | head -n1` (busybox's applet, which Debian's busybox lacks). Only what
 * they use: `-d MS` (the delay between lines; 0 for none) and a format of text and `%Nt`, the
 * UTC time of day with N decimals of the second. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int line(const char *fmt)
{
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    for (const char *p = fmt; *p; p++) {
        if (*p != '%') {
            putchar(*p);
            continue;
        }
        int digits = 0;
        while (p[1] >= '0' && p[1] <= '9')
            digits = digits * 10 + (*++p - '0');
        if (p[1] != 't') {
            fprintf(stderr, "nmeter: only %%Nt is supported\n");
            return -1;
        }
        p++;
        printf("%02d:%02d:%02d", tm.tm_hour, tm.tm_min, tm.tm_sec);
        if (digits > 0) {
            long frac = now.tv_nsec;
            for (int i = digits; i < 9; i++)
                frac /= 10;
            printf(".%0*ld", digits > 9 ? 9 : digits, frac);
        }
    }
    putchar('\n');
    return fflush(stdout) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    long delay_ms = 1000;
    int opt;
    while ((opt = getopt(argc, argv, "d:")) != -1) {
        if (opt != 'd') {
            fprintf(stderr, "usage: nmeter [-d MS] FORMAT\n");
            return 2;
        }
        delay_ms = strtol(optarg, NULL, 10);
    }
    if (optind >= argc) {
        fprintf(stderr, "usage: nmeter [-d MS] FORMAT\n");
        return 2;
    }
    for (;;) {
        if (line(argv[optind]) != 0)
            return 1;
        if (delay_ms > 0)
            usleep((useconds_t)delay_ms * 1000);
    }
}
