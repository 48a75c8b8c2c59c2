/* Asks for an AF_ALG socket three ways and prints each answer: socket(2) in the x86_64 ABI, the
 * same call in the x32 ABI (its number with __X32_SYSCALL_BIT), and socketcall(SYS_SOCKET) in
 * the i386 ABI (int $0x80, which a 64-bit process may use), whose arguments lie in memory below
 * 4 GiB. A number of 0 or more is a socket; a negative one is -errno. */
#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static long answer(long r) { return r < 0 ? -errno : r; }

int main(void) {
    long direct = answer(syscall(SYS_socket, 38 /* AF_ALG */, SOCK_SEQPACKET, 0));
    long x32 = answer(syscall(0x40000000 | SYS_socket, 38, SOCK_SEQPACKET, 0));
    unsigned int *args = mmap(0, 4096, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    if (args == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    args[0] = 38;
    args[1] = SOCK_SEQPACKET;
    args[2] = 0;
    long multiplexed;
    __asm__ volatile("int $0x80"
                     : "=a"(multiplexed)
                     : "a"(102 /* socketcall */), "b"(1 /* SYS_SOCKET */), "c"(args)
                     : "memory");
    printf("socket %ld x32 %ld socketcall %ld\n", direct, x32, multiplexed);
    return 0;
}
