/* `sh` for the node e2e suite's busybox images: Debian's busybox ash (1.35), except that
 * `sh -c WORD`, WORD one plain command name, runs WORD straight away with the whole
 * environment. That is what upstream busybox's ash does since it imports environment
 * variables whose names are not shell names (the env-from specs' `data-1`) and execs a lone
 * command; 1.35's ash drops them first. Everything else, and any WORD not found, is ash's, with
 * ash's messages (the read-only root spec compares one). */
#include <string.h>
#include <unistd.h>

static int plain(const char *w)
{
    if (!*w)
        return 0;
    for (const char *p = w; *p; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-' || *p == '.' || *p == '/'))
            return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "-c") == 0 && plain(argv[2]))
        execvp(argv[2], &argv[2]);
    /* busybox picks its applet by argv[0]'s base name, `sh`. */
    execv("/bin/busybox", argv);
    return 127;
}
