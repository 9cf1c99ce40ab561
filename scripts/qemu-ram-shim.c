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
 * C rather than Rust: it interposes libc's variadic open functions, which stable Rust
 * cannot define. QEMU releases from 8.2 on fall back to a read-only open by themselves.
 *
 * Built by scripts/setup.sh: gcc -O2 -shared -fPIC -o libfarm-ramshim.so qemu-ram-shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
        return flags == -1 ? -1 : next(path, flags, mode);                              \
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
        return flags == -1 ? -1 : next(dir, path, flags, mode);                         \
    }

/* The _FORTIFY_SOURCE entry points take no mode. */
#define OPEN_FORTIFIED(name)                                                            \
    int name(const char *path, int flags)                                               \
    {                                                                                   \
        static int (*next)(const char *, int);                                          \
        if (!next)                                                                      \
            next = (int (*)(const char *, int))dlsym(RTLD_NEXT, #name);                 \
        flags = adjust(path, flags);                                                    \
        return flags == -1 ? -1 : next(path, flags);                                    \
    }

OPEN(open)
OPEN(open64)
OPENAT(openat)
OPENAT(openat64)
OPEN_FORTIFIED(__open_2)
OPEN_FORTIFIED(__open64_2)
