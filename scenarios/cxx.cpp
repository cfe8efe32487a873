// hs-cxx: calls every replaceable operator new/delete variant exactly 1000 times, then
// keeps 1000 x new char[256]. Truth: new_calls=13000, delete_calls=12000, live_bytes=256000.
#include <cstddef>
#include <new>

#include "scenario.h"

static const int N = 1000;
static long new_calls, delete_calls;

struct Obj { char b[100]; };                           // plain 100-byte object
struct alignas(64) Aligned { char b[100]; };           // over-aligned: sizeof == 128
struct WithDtor { char b[100]; ~WithDtor() {} };       // non-trivial dtor: array cookie,
struct alignas(64) AlignedDtor { char b[100]; ~AlignedDtor() {} };  // so delete[] is sized

static void touch(void *p, size_t n)
{
    memset(p, 0x5a, n);
    KEEP(p);
}

// Runs one new+delete pair N times and counts it.
template <class F> static void repeat(F f)
{
    for (int i = 0; i < N; i++)
        f();
    new_calls += N;
    delete_calls += N;
}

static char *kept[N];

int main(int argc, char **argv)
{
    hs_parse(argc, argv, nullptr, 0); // no options

    // operator new(size_t) / sized operator delete(void*, size_t)
    repeat([] { Obj *p = new Obj; touch(p, sizeof *p); delete p; });
    // operator new(size_t) / unsized operator delete(void*)
    repeat([] { void *p = ::operator new(100); touch(p, 100); ::operator delete(p); });
    // operator new[](size_t) / operator delete[](void*) (no cookie, so unsized)
    repeat([] { char *p = new char[100]; touch(p, 100); delete[] p; });
    // operator new[](size_t) / sized operator delete[](void*, size_t) (cookie: 108 bytes)
    repeat([] { WithDtor *p = new WithDtor[1]; touch(p, sizeof *p); delete[] p; });
    // operator new(size_t, nothrow_t) / sized delete
    repeat([] { Obj *p = new (std::nothrow) Obj; touch(p, sizeof *p); delete p; });
    // operator new[](size_t, nothrow_t) / operator delete[](void*)
    repeat([] { char *p = new (std::nothrow) char[100]; touch(p, 100); delete[] p; });
    // operator new(size_t, align_val_t) / operator delete(void*, size_t, align_val_t)
    repeat([] { Aligned *p = new Aligned; touch(p, sizeof *p); delete p; });
    // explicit std::align_val_t form / operator delete(void*, align_val_t)
    repeat([] {
        void *p = ::operator new(100, std::align_val_t(64));
        touch(p, 100);
        ::operator delete(p, std::align_val_t(64));
    });
    // operator new[](size_t, align_val_t) / operator delete[](void*, align_val_t)
    repeat([] { Aligned *p = new Aligned[1]; touch(p, sizeof *p); delete[] p; });
    // operator new[](size_t, align_val_t) / operator delete[](void*, size_t, align_val_t)
    repeat([] { AlignedDtor *p = new AlignedDtor[1]; touch(p, sizeof *p); delete[] p; });
    // operator new(size_t, align_val_t, nothrow_t) / sized aligned delete
    repeat([] { Aligned *p = new (std::nothrow) Aligned; touch(p, sizeof *p); delete p; });
    // operator new[](size_t, align_val_t, nothrow_t) / aligned delete[]
    repeat([] { Aligned *p = new (std::nothrow) Aligned[1]; touch(p, sizeof *p); delete[] p; });

    // What stays live: 1000 x 256 bytes via operator new[](size_t).
    for (int i = 0; i < N; i++) {
        kept[i] = new char[256];
        touch(kept[i], 256);
    }
    new_calls += N;

    printf("cxx: new_calls=%ld delete_calls=%ld live_bytes=%ld\n", new_calls, delete_calls,
           (long)N * 256);
    return 0;
}
