/* hs-lab-containers: how much memory a C++ container of strings leaves resident after it
 * is destroyed, with std::allocator and with libstdc++'s __gnu_cxx::__pool_alloc.
 *
 * For each string length k in --k-list, in one process and in that order: fill a container
 * with N copies of std::string(k, '0') (each with one random character changed, unless
 * --zero 1), measure VmRSS/VmSize in scope, destroy the container, measure again out of
 * scope. The container's allocator is a thin pass-through around std::allocator or
 * __pool_alloc that counts its requests by size, so the output says how many bytes went
 * to requests the pool serves itself (at most 128 bytes) and how many it hands on to
 * operator new. The strings' own character buffers always use std::allocator<char>.
 *
 *   hs-lab-containers --container vector|list|deque --alloc std|pool --n N
 *                     --k-list 8,16,... [--zero 0|1] [--seed S] [--pad B]
 *
 * --pad B keeps a B-byte block allocated from the start, which moves every later heap
 * address by a few bytes: the results should not depend on that, and sometimes do.
 *
 * Output, one JSON object per line: first {"phase": "baseline", ...} with the RSS before
 * any container exists and the sizes involved, then one {"phase": "k", "k": ..., "rss_in",
 * "rss_out", "vm_in", "vm_out", ...} per k, then {"phase": "end", "allocator": ...}. Exit 2
 * on bad arguments. */
#include <ext/pool_allocator.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "lab.h"

namespace {

/* What the container asked its allocator for during one fill. */
struct Requests {
    long long small_bytes = 0; /* requests of at most POOL_MAX bytes: the pool serves these */
    long long small_count = 0;
    long long large_bytes = 0; /* larger requests: the pool hands them to operator new */
    long long large_count = 0;
    long long max_request = 0;
};
Requests g_req;

/* __pool_alloc's limit (its _S_max_bytes): larger requests bypass the pool. */
constexpr std::size_t POOL_MAX = 128;

template <class T, bool Pool>
struct CountingAlloc : std::conditional_t<Pool, __gnu_cxx::__pool_alloc<T>, std::allocator<T>> {
    using Base = std::conditional_t<Pool, __gnu_cxx::__pool_alloc<T>, std::allocator<T>>;
    using value_type = T;
    template <class U>
    struct rebind {
        using other = CountingAlloc<U, Pool>;
    };

    CountingAlloc() noexcept = default;
    template <class U>
    CountingAlloc(const CountingAlloc<U, Pool> &) noexcept
    {
    }

    T *allocate(std::size_t n)
    {
        long long bytes = (long long)(n * sizeof(T));
        if ((std::size_t)bytes <= POOL_MAX) {
            g_req.small_bytes += bytes;
            g_req.small_count++;
        } else {
            g_req.large_bytes += bytes;
            g_req.large_count++;
        }
        if (bytes > g_req.max_request)
            g_req.max_request = bytes;
        return Base::allocate(n);
    }
    void deallocate(T *p, std::size_t n) { Base::deallocate(p, n); }

    friend bool operator==(const CountingAlloc &, const CountingAlloc &) { return true; }
    friend bool operator!=(const CountingAlloc &, const CountingAlloc &) { return false; }
};

struct Options {
    long n = 1000000;
    long zero = 0;
    long seed = 1;
    long pad = 0;
    std::vector<long> ks;
};

void print_mem(const char *phase, long k, lab_mem_t in, lab_mem_t out, long long checksum,
               double fill_s, double free_s)
{
    lab_json_begin();
    lab_json_str("phase", phase);
    lab_json_num("k", k);
    lab_json_num("rss_in", in.rss);
    lab_json_num("vm_in", in.vm);
    lab_json_num("rss_out", out.rss);
    lab_json_num("vm_out", out.vm);
    lab_json_num("pool_small_bytes", g_req.small_bytes);
    lab_json_num("pool_small_count", g_req.small_count);
    lab_json_num("pool_large_bytes", g_req.large_bytes);
    lab_json_num("pool_large_count", g_req.large_count);
    lab_json_num("max_request", g_req.max_request);
    /* glibc's own view after the destruction: bytes in use, free in the heap and in
     * fastbins, mmapped (mallinfo2 walks the bins; it does not allocate). Under another
     * allocator these describe glibc's unused heap; the end line says which one ran. */
    struct mallinfo2 mi = mallinfo2();
    lab_json_num("heap_arena", (long long)mi.arena);
    lab_json_num("heap_in_use", (long long)mi.uordblks);
    lab_json_num("heap_free", (long long)mi.fordblks);
    lab_json_num("heap_fastbin_free", (long long)mi.fsmblks);
    lab_json_num("heap_top_free", (long long)mi.keepcost);
    lab_json_num("heap_mmapped", (long long)mi.hblkhd);
    lab_json_num("checksum", checksum);
    lab_json_real("fill_s", fill_s);
    lab_json_real("free_s", free_s);
    lab_json_end();
}

/* Fills a container with n strings of length k, measures, destroys it, measures. */
template <class Container>
__attribute__((noinline)) void one_k(const Options &o, long k, uint64_t *rng)
{
    g_req = Requests();
    lab_mem_t in, out;
    long long checksum = 0;
    double t0 = hs_now(), t1, t2;
    {
        Container c;
        for (long i = 0; i < o.n; i++) {
            std::string s((std::size_t)k, '0');
            if (!o.zero)
                s[hs_rand(rng) % (uint64_t)k] = (char)('0' + hs_rand(rng) % 26);
            c.push_back(s);
        }
        /* Read every string back so that nothing above can be optimised away. */
        for (const std::string &s : c)
            checksum += (long long)s.size() + s[s.size() / 2];
        KEEP(&c);
        t1 = hs_now();
        in = lab_mem();
    }
    t2 = hs_now();
    out = lab_mem();
    print_mem("k", k, in, out, checksum, t1 - t0, t2 - t1);
}

template <class Container>
void run_all(const Options &o)
{
    uint64_t rng = (uint64_t)o.seed * 0x9E3779B97F4A7C15ULL + 1;
    for (long k : o.ks)
        one_k<Container>(o, k, &rng);
}

template <bool Pool>
int run_container(const char *container, const Options &o)
{
    using A = CountingAlloc<std::string, Pool>;
    if (strcmp(container, "vector") == 0)
        run_all<std::vector<std::string, A>>(o);
    else if (strcmp(container, "list") == 0)
        run_all<std::list<std::string, A>>(o);
    else if (strcmp(container, "deque") == 0)
        run_all<std::deque<std::string, A>>(o);
    else
        return 0;
    return 1;
}

/* Parses "8,16,24" into ks (each 1..1,000,000); 0 if malformed. */
int parse_ks(const char *text, std::vector<long> &ks)
{
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 1 || v > 1000000 || (*end && *end != ','))
            return 0;
        ks.push_back(v);
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p)
            return 0;
    }
    return !ks.empty();
}

} // namespace

int main(int argc, char **argv)
{
    lab_mem_t base = lab_mem(); /* before anything below can touch the heap */
    Options o;
    const char *container = "vector";
    const char *alloc = "std";
    const char *klist = "8,16,32,64,128,256,512,800";
    struct hs_opt opts[] = {
        {"container", NULL, &container}, {"alloc", NULL, &alloc}, {"n", &o.n, NULL},
        {"k-list", NULL, &klist},        {"zero", &o.zero, NULL}, {"seed", &o.seed, NULL},
        {"pad", &o.pad, NULL},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    hs_parse(argc, argv, opts, nopts);
    if (o.n < 1)
        hs_usage_exit(argv[0], "--n must be at least 1, not", "0", opts, nopts);
    if (o.zero > 1)
        hs_usage_exit(argv[0], "--zero takes 0 or 1, not", std::to_string(o.zero).c_str(), opts, nopts);
    if (!parse_ks(klist, o.ks))
        hs_usage_exit(argv[0], "--k-list wants lengths 1..1000000 separated by commas, not", klist,
                      opts, nopts);
    bool pool = strcmp(alloc, "pool") == 0;
    if (!pool && strcmp(alloc, "std") != 0)
        hs_usage_exit(argv[0], "--alloc takes std or pool, not", alloc, opts, nopts);
    if (strcmp(container, "vector") && strcmp(container, "list") && strcmp(container, "deque"))
        hs_usage_exit(argv[0], "--container takes vector, list or deque, not", container, opts, nopts);
    if (o.pad > 1024 * 1024)
        hs_usage_exit(argv[0], "--pad takes 0..1048576 bytes, not", std::to_string(o.pad).c_str(),
                      opts, nopts);
    /* A block kept for the whole run, allocated before anything else: it shifts every later
     * heap address by a few bytes, to show how much the results depend on the layout. */
    char *pad = o.pad ? (char *)malloc((size_t)o.pad) : NULL;
    if (pad) {
        memset(pad, 1, (size_t)o.pad);
        KEEP(pad);
    }

    /* The sizes that decide what the pool sees: the element, a list node, a deque block. */
    lab_json_begin();
    lab_json_str("phase", "baseline");
    lab_json_num("rss", base.rss);
    lab_json_num("vm", base.vm);
    lab_json_str("container", container);
    lab_json_str("alloc", alloc);
    lab_json_num("n", o.n);
    lab_json_num("zero", o.zero);
    lab_json_num("seed", o.seed);
    lab_json_num("pad", o.pad);
    lab_json_num("string_object_bytes", (long long)sizeof(std::string));
    lab_json_num("sso_capacity", (long long)std::string().capacity());
    lab_json_num("list_node_bytes", (long long)sizeof(std::_List_node<std::string>));
    lab_json_num("deque_block_bytes",
                 (long long)(std::__deque_buf_size(sizeof(std::string)) * sizeof(std::string)));
    lab_json_num("pool_max_bytes", (long long)POOL_MAX);
    lab_json_end();

    double t0 = hs_now();
    if (!(pool ? run_container<true>(container, o) : run_container<false>(container, o)))
        return 2;
    lab_mem_t end = lab_mem();
    double seconds = hs_now() - t0;
    lab_json_begin();
    lab_json_str("phase", "end");
    lab_json_num("rss", end.rss);
    lab_json_num("vm", end.vm);
    lab_json_real("seconds", seconds);
    /* Asked only now: a failed dlsym leaves an error message on the heap whose length
     * depends on the program's path, and that alone can change what the fills keep. */
    lab_json_str("allocator", lab_allocator());
    lab_json_end();
    free(pad);
    return 0;
}
