/* The web server of the conformance suite's nginx, hostnet-nginx and httpd images: answers every
 * request on $PORT (default 80) with 200 and a short page. Like nginx it can name itself
 * ($TITLE becomes argv[0], so /proc/PID/cmdline shows it) and write its pid ($PIDFILE); it logs
 * one line naming itself when it listens. SIGTERM, SIGINT or SIGQUIT (nginx's stop signal) ends
 * it, also as PID 1 of a namespace. */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

int main(int argc, char **argv)
{
    (void)argc;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    self[n] = 0;
    const char *title = getenv("TITLE");
    if (title && *title && strcmp(argv[0], title) != 0) {
        /* Re-exec the same file with the title as its whole command line: the kernel keeps
         * naming the process after the file (comm), so pidof still finds it by that name. */
        char *const title_argv[] = {(char *)title, NULL};
        execv(self, title_argv);
        perror("execv");
        return 1;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGQUIT, on_term);
    signal(SIGPIPE, SIG_IGN);
    const char *port_env = getenv("PORT");
    int port = port_env ? atoi(port_env) : 80;
    int s = socket(AF_INET6, SOCK_STREAM, 0);
    int off = 0, on = 1;
    setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in6 addr = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 64) != 0) {
        perror("listen");
        return 1;
    }
    const char *pidfile = getenv("PIDFILE");
    if (pidfile && *pidfile) {
        FILE *f = fopen(pidfile, "w");
        if (!f) {
            perror(pidfile);
            return 1;
        }
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }
    const char *name = strrchr(self, '/');
    fprintf(stderr, "%s: serving HTTP on port %d\n", name ? name + 1 : self, port);
    static const char page[] = "<html><body>It works!</body></html>\n";
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR)
                continue;
            perror("accept");
            return 1;
        }
        /* One read is enough for the request line and headers of a GET. */
        char buf[8192];
        if (read(c, buf, sizeof buf) > 0) {
            char head[256];
            int len = snprintf(head, sizeof head,
                               "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                               "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                               sizeof page - 1);
            if (write(c, head, len) == len)
                (void)!write(c, page, sizeof page - 1);
        }
        close(c);
    }
}
