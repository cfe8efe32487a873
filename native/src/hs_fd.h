/* hs_fd.h: how the library opens a file in the program. A process may run with fd 0, 1
 * or 2 closed, and open() then takes that number: the program's next open, or its writes
 * to stderr, would reach our file. So a descriptor that lands below 3 is moved above it
 * at once (F_DUPFD_CLOEXEC, a floor of 3), and every one is closed by its user before it
 * returns to the program. */
#ifndef HS_FD_H
#define HS_FD_H

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

static inline int hs_open(const char *path, int flags, int mode) {
  int fd = open(path, flags | O_CLOEXEC, mode);
  if (fd >= 0 && fd < 3) {
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    int saved = errno;
    close(fd);
    errno = saved;
    fd = high;
  }
  return fd;
}

#endif
