// 8 threads build vectors of strings in waves and keep 1 in 500 in a shared cache; after
// the last wave the program prints its own RSS (from /proc/self/statm) and idles ARGV[1] ms.
#include <string>
#include <vector>
#include <thread>
#include <mutex>
#include <cstdio>
#include <unistd.h>
#include <cstdlib>
static std::mutex mu;
static std::vector<std::string> cache;
static long rss() { FILE *f = fopen("/proc/self/statm","r"); long a,b; fscanf(f,"%ld %ld",&a,&b); fclose(f); return b*4096; }
void worker(int id) {
  for (int wave = 0; wave < 6; wave++) {
    std::vector<std::string> v;
    for (int i = 0; i < 60000; i++) v.emplace_back(100 + (i % 300), 'a' + id);
    std::lock_guard<std::mutex> g(mu);
    for (size_t i = 0; i < v.size(); i += 500) cache.push_back(v[i]);
  }
}
int main(int argc, char **argv) {
  std::vector<std::thread> t;
  for (int i = 0; i < 8; i++) t.emplace_back(worker, i);
  for (auto &x : t) x.join();
  fprintf(stderr, "after waves rss %ld\n", rss());
  usleep(argc > 1 ? atoi(argv[1]) * 1000 : 1000000);
  return 0;
}
