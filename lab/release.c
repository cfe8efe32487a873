/* hs-lab-release: which freed blocks go back to the OS, by size and allocation order.
 *
 *   hs-lab-release --order shuffled|ascending|descending --max-mb N [--seed S] [--hold-ms M]
 *
 * One block at a time, for each size of the sweep 2 KiB, 20 KiB, 200 KiB, 2 MiB, 20 MiB,
 * 200 MiB, 2 GiB that is at most N MiB, in the given order: read VmSize and VmRSS, malloc
 * the block and write every byte of it, read them again, free it, wait M ms (default 0),
 * read them a third time. Only one block is alive at any moment, so whatever the process
 * still holds after a free is what the allocator kept.
 *
 * Output, one JSON object per line on stdout:
 *   {"event": "start", "allocator", "order", "seed", "max_mb", "blocks", "page"}
 *   {"event": "block", "index", "size", "order", "allocator", "vm_before", "rss_before",
 *    "vm_during", "rss_during", "vm_after", "rss_after", "mmapped_during"}
 *   {"event": "done", "allocator", "order", "blocks", "vm_end", "rss_end", "seconds"}
 * mmapped_during is glibc's mallinfo2().hblkhd while the block is alive (bytes in chunks
 * served by mmap; 0 under other allocators). Sizes in bytes.
 *
 * stdout gets a static buffer so that printing never allocates: the heap holds nothing
 * but the blocks under test (and what the allocator set up for itself).
 * Exit 0 on success, 1 if a malloc fails, 2 on bad arguments. */
#include "lab.h"

#define NSIZES 7
static const long long SIZES[NSIZES] = {
    2LL * 1024,        20LL * 1024,        200LL * 1024,       2LL * 1024 * 1024,
    20LL * 1024 * 1024, 200LL * 1024 * 1024, 2048LL * 1024 * 1024,
};

static char out_buf[1 << 16];

int main(int argc, char **argv)
{
    const char *order = "shuffled";
    long max_mb = 200, seed = 1, hold_ms = 0;
    const struct hs_opt opts[] = {
        {"order", NULL, &order},
        {"max-mb", &max_mb, NULL},
        {"seed", &seed, NULL},
        {"hold-ms", &hold_ms, NULL},
    };
    const int nopts = (int)(sizeof opts / sizeof opts[0]);
    hs_parse(argc, argv, opts, nopts);
    if (strcmp(order, "shuffled") && strcmp(order, "ascending") && strcmp(order, "descending"))
        hs_usage_exit(argv[0], "--order must be shuffled, ascending or descending", order, opts,
                      nopts);

    setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
    /* Which allocator answers: asked once, before any measurement (the look-ups that miss
     * may allocate an error message). */
    const char *alloc = lab_allocator();

    long long sizes[NSIZES];
    int n = 0;
    for (int i = 0; i < NSIZES; i++)
        if (SIZES[i] <= (long long)max_mb * MIB)
            sizes[n++] = SIZES[i];
    if (n == 0)
        hs_usage_exit(argv[0], "--max-mb leaves no block size (the smallest is 2 KiB)", "0", opts,
                      nopts);
    if (strcmp(order, "descending") == 0) {
        for (int i = 0; i < n / 2; i++) {
            long long t = sizes[i];
            sizes[i] = sizes[n - 1 - i];
            sizes[n - 1 - i] = t;
        }
    } else if (strcmp(order, "shuffled") == 0) {
        /* Fisher-Yates with a seeded xorshift: the same seed gives the same order */
        uint64_t state = 0x9E3779B97F4A7C15ULL ^ (uint64_t)seed;
        if (state == 0)
            state = 1;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)hs_rand_range(&state, 0, (size_t)i);
            long long t = sizes[i];
            sizes[i] = sizes[j];
            sizes[j] = t;
        }
    }

    long page = sysconf(_SC_PAGESIZE);
    lab_json_begin();
    lab_json_str("event", "start");
    lab_json_str("allocator", alloc);
    lab_json_str("order", order);
    lab_json_num("seed", seed);
    lab_json_num("max_mb", max_mb);
    lab_json_num("blocks", n);
    lab_json_num("page", page);
    lab_json_end();

    double t0 = hs_now();
    for (int i = 0; i < n; i++) {
        size_t size = (size_t)sizes[i];
        lab_mem_t before = lab_mem();
        char *p = malloc(size);
        if (!p) {
            fprintf(stderr, "%s: malloc(%zu) failed\n", argv[0], size);
            return 1;
        }
        memset(p, 0xA5, size); /* every page becomes resident */
        KEEP(p);
        lab_mem_t during = lab_mem();
        struct mallinfo2 mi = lab_mallinfo2();
        free(p);
        if (hold_ms > 0)
            hs_sleep_ms(hold_ms);
        lab_mem_t after = lab_mem();

        lab_json_begin();
        lab_json_str("event", "block");
        lab_json_num("index", i);
        lab_json_num("size", (long long)size);
        lab_json_str("order", order);
        lab_json_str("allocator", alloc);
        lab_json_num("vm_before", before.vm);
        lab_json_num("rss_before", before.rss);
        lab_json_num("vm_during", during.vm);
        lab_json_num("rss_during", during.rss);
        lab_json_num("vm_after", after.vm);
        lab_json_num("rss_after", after.rss);
        lab_json_num("mmapped_during", (long long)mi.hblkhd);
        lab_json_end();
    }
    lab_mem_t end = lab_mem();
    lab_json_begin();
    lab_json_str("event", "done");
    lab_json_str("allocator", alloc);
    lab_json_str("order", order);
    lab_json_num("blocks", n);
    lab_json_num("vm_end", end.vm);
    lab_json_num("rss_end", end.rss);
    lab_json_real("seconds", hs_now() - t0);
    lab_json_end();
    return 0;
}
