/* Entry point of the conformance suite's nonewprivs image: installed setuid root, it prints the
 * effective uid it runs with, so the suite sees whether no_new_privs kept the setuid bit from
 * taking effect. */
#include <stdio.h>
#include <unistd.h>

int main(void)
{
    printf("Effective uid: %u\n", (unsigned)geteuid());
    return 0;
}
