/* faultshim.c — fault injection for libmemcolo's system calls (test/faults.sh).
 * Preloaded before libmemcolo.so (LD_PRELOAD="faultshim.so libmemcolo.so"), it defines
 * mmap, munmap, madvise, mlock and mremap, which the library calls through the PLT:
 * each goes straight to the system call (no dlsym, no allocation) unless the
 * environment variable MCFI asks for a failure. MCFI is a comma-separated list of
 *     OP=ERRNO:PERIOD:BURST[:SKIP]
 * OP is mmap, munmap, madvise, madvise.N (advice N only: 4 DONTNEED, 23
 * POPULATE_WRITE, 25 COLLAPSE), mlock or mremap; ERRNO is ENOMEM, EAGAIN, EINVAL,
 * EINTR, EBUSY or EFAULT. After SKIP calls of OP that pass (default 0), of every PERIOD
 * calls the first BURST fail with ERRNO without reaching the kernel (PERIOD = BURST:
 * every call fails). Only calls made from libmemcolo's code are failed (the caller's
 * address in a loaded object whose name contains "libmemcolo", found with
 * dl_iterate_phdr: the program's own mappings, such as CPython's data stack, are left
 * alone), and of mmap only anonymous private mappings. Per rule, the calls seen and the calls failed are appended to the file named
 * by MCFI_COUNTS at exit ("madvise.25 12 12"), for the test to see that the faults were
 * really injected. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { OP_MMAP, OP_MUNMAP, OP_MADVISE, OP_MLOCK, OP_MREMAP, OP__N };
static const char *op_names[OP__N] = {"mmap", "munmap", "madvise", "mlock", "mremap"};

#define MAX_RULES 8
struct rule {
  int op, advice; /* advice -1: any */
  int err;
  unsigned long period, burst, skip;
  unsigned long calls, failed;
};
static struct rule rules[MAX_RULES];
static int nrules, parsed;

static int errno_of(const char *s, size_t n) {
  static const struct { const char *name; int v; } t[] = {
      {"ENOMEM", ENOMEM}, {"EAGAIN", EAGAIN}, {"EINVAL", EINVAL},
      {"EINTR", EINTR},   {"EBUSY", EBUSY},   {"EFAULT", EFAULT}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (strlen(t[i].name) == n && memcmp(t[i].name, s, n) == 0) return t[i].v;
  return 0;
}

static unsigned long num(const char **p) {
  unsigned long v = 0;
  while (**p >= '0' && **p <= '9') v = v * 10 + (unsigned long)(*(*p)++ - '0');
  return v;
}

/* parses MCFI once (getenv allocates nothing) */
static void parse(void) {
  if (__atomic_load_n(&parsed, __ATOMIC_ACQUIRE)) return;
  const char *s = getenv("MCFI");
  while (s && *s && nrules < MAX_RULES) {
    struct rule r = {0};
    r.advice = -1;
    int op = -1;
    for (int i = 0; i < OP__N; i++) {
      size_t l = strlen(op_names[i]);
      if (strncmp(s, op_names[i], l) == 0 && (s[l] == '=' || s[l] == '.')) { op = i; s += l; break; }
    }
    if (op < 0) break;
    r.op = op;
    if (*s == '.') { s++; r.advice = (int)num(&s); }
    if (*s++ != '=') break;
    const char *e = s;
    while (*e && *e != ':') e++;
    r.err = errno_of(s, (size_t)(e - s));
    if (*e != ':') break;
    s = e + 1;
    r.period = num(&s);
    if (*s++ != ':') break;
    r.burst = num(&s);
    if (*s == ':') { s++; r.skip = num(&s); }
    if (r.err && r.period) rules[nrules++] = r;
    while (*s && *s != ',') s++;
    if (*s == ',') s++;
  }
  __atomic_store_n(&parsed, 1, __ATOMIC_RELEASE);
}

/* the loaded segments of libmemcolo, found once (dl_iterate_phdr allocates nothing) */
#define MAX_SEGS 8
static uintptr_t seg_lo[MAX_SEGS], seg_hi[MAX_SEGS];
static int nsegs, segs_found;

static int find_lib(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  (void)arg;
  if (info->dlpi_name == NULL || strstr(info->dlpi_name, "libmemcolo") == NULL) return 0;
  for (int i = 0; i < info->dlpi_phnum && nsegs < MAX_SEGS; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    seg_lo[nsegs] = info->dlpi_addr + ph->p_vaddr;
    seg_hi[nsegs] = seg_lo[nsegs] + ph->p_memsz;
    nsegs++;
  }
  return 1;
}

static int from_lib(uintptr_t ra) {
  if (!__atomic_load_n(&segs_found, __ATOMIC_ACQUIRE)) {
    dl_iterate_phdr(find_lib, NULL);
    __atomic_store_n(&segs_found, 1, __ATOMIC_RELEASE);
  }
  for (int i = 0; i < nsegs; i++)
    if (ra >= seg_lo[i] && ra < seg_hi[i]) return 1;
  return 0;
}

/* nonzero (the errno) if this call of op, made from ra, fails */
static int inject(int op, int advice, uintptr_t ra) {
  parse();
  if (nrules == 0 || !from_lib(ra)) return 0;
  for (int i = 0; i < nrules; i++) {
    struct rule *r = &rules[i];
    if (r->op != op || (r->advice >= 0 && r->advice != advice)) continue;
    unsigned long n = __atomic_fetch_add(&r->calls, 1, __ATOMIC_RELAXED);
    if (n < r->skip) return 0;
    if ((n - r->skip) % r->period < r->burst) {
      __atomic_fetch_add(&r->failed, 1, __ATOMIC_RELAXED);
      return r->err;
    }
  }
  return 0;
}

static char *put_u(char *b, unsigned long v) {
  char d[24];
  int k = 0;
  do { d[k++] = (char)('0' + v % 10); v /= 10; } while (v);
  while (k) *b++ = d[--k];
  return b;
}

/* "OP[.ADVICE] CALLS FAILED" per rule, appended to $MCFI_COUNTS */
__attribute__((destructor)) static void write_counts(void) {
  const char *path = getenv("MCFI_COUNTS");
  if (path == NULL) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  for (int i = 0; i < nrules; i++) {
    char line[96], *b = line;
    const char *name = op_names[rules[i].op];
    memcpy(b, name, strlen(name));
    b += strlen(name);
    if (rules[i].advice >= 0) { *b++ = '.'; b = put_u(b, (unsigned long)rules[i].advice); }
    *b++ = ' ';
    b = put_u(b, rules[i].calls);
    *b++ = ' ';
    b = put_u(b, rules[i].failed);
    *b++ = '\n';
    if (write(fd, line, (size_t)(b - line)) < 0) break;
  }
  close(fd);
}

void *mmap(void *a, size_t l, int p, int f, int fd, off_t o) {
  uintptr_t ra = (uintptr_t)__builtin_return_address(0);
  int e = (f & MAP_ANONYMOUS) && (f & MAP_PRIVATE) ? inject(OP_MMAP, -1, ra) : 0;
  if (e) { errno = e; return MAP_FAILED; }
  return (void *)syscall(SYS_mmap, a, l, p, f, fd, o);
}
void *mmap64(void *a, size_t l, int p, int f, int fd, off_t o) {
  uintptr_t ra = (uintptr_t)__builtin_return_address(0);
  int e = (f & MAP_ANONYMOUS) && (f & MAP_PRIVATE) ? inject(OP_MMAP, -1, ra) : 0;
  if (e) { errno = e; return MAP_FAILED; }
  return (void *)syscall(SYS_mmap, a, l, p, f, fd, o);
}

int munmap(void *a, size_t l) {
  int e = inject(OP_MUNMAP, -1, (uintptr_t)__builtin_return_address(0));
  if (e) { errno = e; return -1; }
  return (int)syscall(SYS_munmap, a, l);
}

int madvise(void *a, size_t l, int adv) {
  int e = inject(OP_MADVISE, adv, (uintptr_t)__builtin_return_address(0));
  if (e) { errno = e; return -1; }
  return (int)syscall(SYS_madvise, a, l, adv);
}

int mlock(const void *a, size_t l) {
  int e = inject(OP_MLOCK, -1, (uintptr_t)__builtin_return_address(0));
  if (e) { errno = e; return -1; }
  return (int)syscall(SYS_mlock, a, l);
}

void *mremap(void *a, size_t ol, size_t nl, int f, ...) {
  void *na = NULL;
  if (f & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, f);
    na = va_arg(ap, void *);
    va_end(ap);
  }
  int e = inject(OP_MREMAP, -1, (uintptr_t)__builtin_return_address(0));
  if (e) { errno = e; return MAP_FAILED; }
  return (void *)syscall(SYS_mremap, a, ol, nl, f, na);
}
