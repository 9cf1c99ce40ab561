/*
 * libfarm-ramshim.so: preloaded into every QEMU that forks a snapshot (LD_PRELOAD).
 *
 * A fork maps the snapshot's RAM file privately (copy-on-write), so it never writes the
 * file, and farm keeps that file root's with mode 0444 while QEMU runs as a uid of its own.
 * QEMU 7.2's memory-backend-file still opens the file O_RDWR, which the kernel refuses.
 * This shim turns exactly that open into an O_RDONLY one: the path named by FARM_RO_PATH
 * (compared byte for byte, e.g. "/proc/self/fd/10"). A private writable mapping of a
 * read-only descriptor is allowed, so the guest runs normally; the file cannot be written
 * because the kernel refuses, not because of this shim. Any open of that path that would
 * create or truncate is refused. Every other open passes through unchanged.
 *
 * Reset in place (FARM_RAM_PRIVATE=1, FARM_RESET_FD=N): QEMU is told the RAM is shared
 * (share=on), so that its state streams and internal snapshots leave RAM out
 * (x-ignore-shared), but this shim maps that file privately all the same. A thread reads
 * descriptor N: each 'R' drops every private page of that mapping (MADV_DONTNEED), so guest
 * RAM reads the snapshot's file again, byte for byte, and the thread answers 'K' (or 'E'
 * and the errno). farm sends 'R' only while the guest is stopped, and then loads the
 * device state, which makes QEMU throw away all translated code (cpu_common_post_load).
 *
 * C rather than Rust: it interposes libc's variadic open functions, which stable Rust
 * cannot define. QEMU releases from 8.2 on fall back to a read-only open by themselves.
 *
 * Built by scripts/setup.sh: gcc -O2 -shared -fPIC -o libfarm-ramshim.so qemu-ram-shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The RAM file's descriptor once opened, and its writable mapping (reset mode). */
static int ram_fd = -1;
static void *ram_base;
static size_t ram_len;

static int private_shared(void)
{
    static int mode = -1;
    if (mode < 0) {
        const char *value = getenv("FARM_RAM_PRIVATE");
        mode = value && strcmp(value, "1") == 0;
    }
    return mode;
}

static const char *read_only_path(void)
{
    static const char *path;
    static int looked;
    if (!looked) {
        path = getenv("FARM_RO_PATH");
        looked = 1;
    }
    return path;
}

/* The flags to open with, or -1 (errno set) to refuse. */
static int adjust(const char *path, int flags)
{
    const char *target = read_only_path();
    if (!target || !path || strcmp(path, target) != 0)
        return flags;
    if (flags & (O_CREAT | O_TRUNC)) {
        errno = EACCES;
        return -1;
    }
    if ((flags & O_ACCMODE) == O_RDWR)
        flags = (flags & ~O_ACCMODE) | O_RDONLY;
    return flags;
}

/* Notes the descriptor of the RAM file (the last one opened). */
static int remember(const char *path, int fd)
{
    const char *target = read_only_path();
    if (fd >= 0 && target && path && strcmp(path, target) == 0)
        ram_fd = fd;
    return fd;
}

static mode_t mode_argument(int flags, va_list ap)
{
    return (flags & O_CREAT) || ((flags & O_TMPFILE) == O_TMPFILE) ? va_arg(ap, mode_t) : 0;
}

#define OPEN(name)                                                                      \
    int name(const char *path, int flags, ...)                                          \
    {                                                                                   \
        static int (*next)(const char *, int, ...);                                     \
        va_list ap;                                                                     \
        va_start(ap, flags);                                                            \
        mode_t mode = mode_argument(flags, ap);                                         \
        va_end(ap);                                                                     \
        if (!next)                                                                      \
            next = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, #name);            \
        flags = adjust(path, flags);                                                    \
        return flags == -1 ? -1 : remember(path, next(path, flags, mode));              \
    }

#define OPENAT(name)                                                                    \
    int name(int dir, const char *path, int flags, ...)                                 \
    {                                                                                   \
        static int (*next)(int, const char *, int, ...);                                \
        va_list ap;                                                                     \
        va_start(ap, flags);                                                            \
        mode_t mode = mode_argument(flags, ap);                                         \
        va_end(ap);                                                                     \
        if (!next)                                                                      \
            next = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, #name);       \
        flags = adjust(path, flags);                                                    \
        return flags == -1 ? -1 : remember(path, next(dir, path, flags, mode));         \
    }

/* The _FORTIFY_SOURCE entry points take no mode. */
#define OPEN_FORTIFIED(name)                                                            \
    int name(const char *path, int flags)                                               \
    {                                                                                   \
        static int (*next)(const char *, int);                                          \
        if (!next)                                                                      \
            next = (int (*)(const char *, int))dlsym(RTLD_NEXT, #name);                 \
        flags = adjust(path, flags);                                                    \
        return flags == -1 ? -1 : remember(path, next(path, flags));                    \
    }

OPEN(open)
OPEN(open64)
OPENAT(openat)
OPENAT(openat64)
OPEN_FORTIFIED(__open_2)
OPEN_FORTIFIED(__open64_2)

/* Reset mode: the RAM file mapped shared is mapped privately instead, and remembered. */
#define MMAP(name)                                                                      \
    void *name(void *addr, size_t len, int prot, int flags, int fd, off_t offset)       \
    {                                                                                   \
        static void *(*next)(void *, size_t, int, int, int, off_t);                     \
        if (!next)                                                                      \
            next = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, #name); \
        int ours = private_shared() && fd >= 0 && fd == ram_fd;                        \
        if (ours && (flags & MAP_TYPE) != MAP_PRIVATE)                                  \
            flags = (flags & ~(MAP_TYPE | MAP_SYNC)) | MAP_PRIVATE;                     \
        void *mapped = next(addr, len, prot, flags, fd, offset);                        \
        if (ours && mapped != MAP_FAILED && (prot & PROT_WRITE)) {                      \
            ram_base = mapped;                                                          \
            ram_len = len;                                                              \
        }                                                                               \
        return mapped;                                                                  \
    }

MMAP(mmap)
MMAP(mmap64)

static int write_all(int fd, const char *bytes, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, bytes, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        bytes += n;
        len -= (size_t)n;
    }
    return 0;
}

static void *reset_loop(void *arg)
{
    int fd = (int)(intptr_t)arg;
    for (;;) {
        char command;
        ssize_t n = read(fd, &command, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return NULL;
        char reply[16] = "K";
        size_t len = 1;
        if (command != 'R') {
            reply[0] = 'E';
            reply[1] = 0;
            reply[2] = 0;
            reply[3] = 0;
            reply[4] = EINVAL;
            len = 5;
        } else if (!ram_base) {
            reply[0] = 'E';
            memset(reply + 1, 0, 4);
            reply[4] = ENOENT;
            len = 5;
        } else if (madvise(ram_base, ram_len, MADV_DONTNEED) != 0) {
            int error = errno;
            reply[0] = 'E';
            reply[1] = (char)(error >> 24);
            reply[2] = (char)(error >> 16);
            reply[3] = (char)(error >> 8);
            reply[4] = (char)error;
            len = 5;
        }
        if (write_all(fd, reply, len) != 0)
            return NULL;
    }
}

__attribute__((constructor)) static void start_reset_thread(void)
{
    const char *value = getenv("FARM_RESET_FD");
    if (!value || !private_shared())
        return;
    char *end;
    long fd = strtol(value, &end, 10);
    if (*end != 0 || fd < 0 || fd > 1 << 20)
        return;
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 << 10);
    pthread_create(&thread, &attr, reset_loop, (void *)(intptr_t)fd);
    pthread_attr_destroy(&attr);
}
