/* hs-reach: blocks of every class memcheck's leak check tells apart, with their truth.
 *   kept        a global list of --kept nodes (still reachable), plus one block whose only
 *               pointer is in a thread's stack, one in the main thread's TLS and one in the
 *               other thread's TLS, and one mmapped block (256 KiB) in a global;
 *   lost        --lost blocks whose pointers are dropped, and one mmapped block dropped;
 *   list        a list of --list nodes whose head pointer is dropped: its head is definitely
 *               lost, the rest indirectly lost;
 *   interior    one 64 KiB block a global points into (4096 bytes in): possibly lost.
 * Sizes are 8 more than a multiple of 16, so a block's usable bytes are its requested
 * bytes (glibc): usable and requested figures agree. The thread is still alive, blocked,
 * when main returns. Prints "reach: <class>_blocks=N <class>_bytes=B ...". */
#include <pthread.h>
#include <unistd.h>

#include "scenario.h"

struct node {
    struct node *next;
    char pad[1008 - sizeof(struct node *) + 8]; /* 1016 bytes in all: usable == requested */
};

/* volatile: the stores stay (a pointer only written is otherwise dropped, and its malloc) */
struct node *volatile g_kept;
char *volatile g_inner;
void *volatile g_big;
__thread void *volatile t_main_tls;
__thread void *volatile t_thread_tls;
static int g_ready[2], g_block[2];

static void *thread_main(void *arg)
{
    (void)arg;
    void *volatile on_stack = malloc(4088); /* only this thread's stack points to it */
    memset(on_stack, 3, 4088);
    t_thread_tls = malloc(2040);            /* only this thread's TLS does */
    char c = 1;
    (void)!write(g_ready[1], &c, 1);
    (void)!read(g_block[0], &c, 1);         /* blocked until the process ends */
    KEEP(on_stack);
    return NULL;
}

__attribute__((noinline)) static void drop_lost(long n)
{
    for (long i = 0; i < n; i++) {
        char *p = malloc(2008);
        memset(p, 1, 2008);
        KEEP(p);
    }
    void *big = malloc(256 * 1024 - 8); /* mmapped (above the 128 KiB threshold) */
    memset(big, 2, 4096);
    KEEP(big);
}

__attribute__((noinline)) static void drop_list(long n)
{
    struct node *head = NULL;
    for (long i = 0; i < n; i++) {
        struct node *x = malloc(sizeof *x);
        memset(x->pad, 4, sizeof x->pad);
        x->next = head;
        head = x;
    }
    KEEP(head);
}

int main(int argc, char **argv)
{
    long kept = 1000, lost = 500, list = 300;
    const struct hs_opt opts[] = {{"kept", &kept, NULL}, {"lost", &lost, NULL}, {"list", &list, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (pipe(g_ready) || pipe(g_block))
        abort();
    for (long i = 0; i < kept; i++) {
        struct node *x = malloc(sizeof *x);
        memset(x->pad, 5, sizeof x->pad);
        x->next = g_kept;
        g_kept = x;
    }
    g_big = malloc(256 * 1024 - 8);
    memset(g_big, 6, 4096);
    t_main_tls = malloc(3064);
    pthread_t t;
    pthread_create(&t, NULL, thread_main, NULL);
    char c;
    (void)!read(g_ready[0], &c, 1);
    drop_lost(lost);
    drop_list(list);
    g_inner = (char *)malloc(65544) + 4096;
    long node = (long)sizeof(struct node);
    /* written with write(2): no stdio buffer is left allocated */
    char line[512];
    int n = snprintf(line, sizeof line,
                     "reach: still_reachable_blocks=%ld still_reachable_bytes=%ld "
                     "definitely_lost_blocks=%ld definitely_lost_bytes=%ld "
                     "indirectly_lost_blocks=%ld indirectly_lost_bytes=%ld "
                     "possibly_lost_blocks=1 possibly_lost_bytes=65544\n",
                     kept + 4, kept * node + (256 * 1024 - 8) + 3064 + 4088 + 2040,
                     lost + 2, lost * 2008 + (256 * 1024 - 8) + node,
                     list - 1, (list - 1) * node);
    (void)!write(1, line, (size_t)n);
    return 0;
}
