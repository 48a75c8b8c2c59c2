/* The entry point of the node e2e suite's pause image: it sleeps until SIGINT or SIGTERM ends it
 * (also as PID 1 of a namespace, where the kernel ignores signals without a handler), reaping
 * whatever children it inherits. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_end(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_child(int sig)
{
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void)
{
    signal(SIGINT, on_end);
    signal(SIGTERM, on_end);
    signal(SIGCHLD, on_child);
    for (;;)
        pause();
}
