// The caching-allocator simulation against sequences worked by hand from the rules of
// c10/cuda/CUDACachingAllocator.cpp (the constants: 512 B blocks, 1 MiB small requests,
// 2 MiB small segments, 20 MiB large segments below 10 MiB, 2 MiB rounding above).
#include <catch2/catch.hpp>
#include <initializer_list>

#include "memfit/allocator.hpp"
#include "memfit/error.hpp"

using namespace memfit::alloc;

namespace {

constexpr std::uint64_t MiB = 1 << 20;

/// Writes a trace like the tracker does: n > 0 allocates n bytes, -k - 1 frees allocation k.
Result run(std::initializer_list<std::int64_t> trace, const Config& c = {}) { return simulate(events_from_signed(trace), c); }

std::vector<std::uint64_t> sizes(const SegmentView& s) {
  std::vector<std::uint64_t> v;
  for (const BlockView& b : s.blocks) v.push_back(b.size);
  return v;
}

}  // namespace

TEST_CASE("requests round up to 512 bytes and small ones share a 2 MiB segment", "[allocator]") {
  const Result r = run({1, 513});
  CHECK(r.stats.peak_requested == 514);
  CHECK(r.stats.peak_allocated == 512 + 1024);
  CHECK(r.stats.peak_reserved == 2 * MiB);
  REQUIRE(r.segments.size() == 1);
  CHECK(r.segments[0].small_pool);
  CHECK(sizes(r.segments[0]) == std::vector<std::uint64_t>{512, 1024, 2 * MiB - 1536});
}

TEST_CASE("freed neighbours merge back into one cached block; the segment stays reserved", "[allocator]") {
  const Result r = run({1000, 1000, 1000, -2, -1, -3});
  CHECK(r.stats.allocated == 0);
  CHECK(r.stats.reserved == 2 * MiB);
  REQUIRE(r.segments.size() == 1);
  CHECK(sizes(r.segments[0]) == std::vector<std::uint64_t>{2 * MiB});
}

TEST_CASE("a 1-10 MiB request splits a 20 MiB segment; a tail of 1 MiB or less is not split off", "[allocator]") {
  // 5 MiB -> 20 MiB segment split 5 + 15. Then 14.5 MiB takes the 15 MiB block whole
  // (remainder 0.5 MiB is not > 1 MiB), so allocated counts the full 15 MiB.
  const Result r = run({5 * MiB, 14 * MiB + MiB / 2});
  CHECK(r.stats.peak_reserved == 20 * MiB);
  CHECK(r.stats.peak_allocated == 20 * MiB);
  CHECK(r.stats.peak_requested == 19 * MiB + MiB / 2);
  CHECK(sizes(r.segments[0]) == std::vector<std::uint64_t>{5 * MiB, 15 * MiB});
}

TEST_CASE("requests of 10 MiB and more get their own segment, rounded up to 2 MiB", "[allocator]") {
  // 13 MiB + 1 B -> 13 MiB + 512 B -> a 14 MiB segment; the 1 MiB - 512 B tail is kept in the block.
  const Result r = run({12 * MiB, 13 * MiB + 1});
  CHECK(r.stats.peak_reserved == 26 * MiB);
  CHECK(r.stats.peak_allocated == 26 * MiB);
  CHECK(r.stats.segments == 2);
}

TEST_CASE("best fit takes the smallest cached block that fits and splits it", "[allocator]") {
  // 25 MiB -> 26 MiB segment, 21 MiB -> 22 MiB segment (1 MiB tails stay in the blocks).
  // Both freed; 20.5 MiB takes the 22 MiB block and splits off 1.5 MiB (> 1 MiB).
  const Result r = run({25 * MiB, 21 * MiB, -1, -2, 20 * MiB + MiB / 2});
  CHECK(r.stats.peak_reserved == 48 * MiB);
  CHECK(r.stats.segments == 2);
  CHECK(r.stats.allocated == 20 * MiB + MiB / 2);
  REQUIRE(r.segments.size() == 2);
  CHECK(sizes(r.segments[0]) == std::vector<std::uint64_t>{26 * MiB});
  CHECK(sizes(r.segments[1]) == std::vector<std::uint64_t>{20 * MiB + MiB / 2, 3 * MiB / 2});
}

TEST_CASE("a hole too small for the next request costs a new segment: fragmentation at the peak", "[allocator]") {
  // A, B, C of 6 MiB fill one 20 MiB segment (6 + 6 + 6, 2 MiB tail split off). B freed leaves a
  // 6 MiB hole; 7 MiB fits neither the hole nor the 2 MiB tail, so a second 20 MiB segment.
  const Result r = run({6 * MiB, 6 * MiB, 6 * MiB, -2, 7 * MiB});
  CHECK(r.stats.peak_reserved == 40 * MiB);
  CHECK(r.stats.allocated == 19 * MiB);
  CHECK(r.stats.allocated_at_peak_reserved == 19 * MiB);
  CHECK(fragmentation_at_peak(r.stats) == 21 * MiB);
  CHECK(sizes(r.segments[0]) == std::vector<std::uint64_t>{6 * MiB, 6 * MiB, 6 * MiB, 2 * MiB});
}

TEST_CASE("before an out-of-memory the cache is released and the allocation retried", "[allocator]") {
  Config c;
  c.device_limit = 40 * MiB;
  // 12 MiB cached (freed), then 30 MiB: 12 + 30 > 40, so the cached segment goes back first.
  const Result ok = run({12 * MiB, -1, 30 * MiB}, c);
  CHECK_FALSE(ok.stats.oom);
  CHECK(ok.stats.retries == 1);
  CHECK(ok.stats.device_frees == 1);
  CHECK(ok.stats.reserved == 30 * MiB);
  CHECK(ok.stats.peak_reserved == 30 * MiB);
  // Still held: nothing to release, so the 30 MiB request fails (event 1).
  const Result oom = run({12 * MiB, 30 * MiB, -1}, c);
  CHECK(oom.stats.oom);
  CHECK(oom.stats.oom_event == 1);
  CHECK(oom.stats.oom_bytes == 30 * MiB);
  CHECK(oom.stats.reserved == 12 * MiB);
}

TEST_CASE("without max_split_size a large cached block is split for a smaller request", "[allocator]") {
  const Result r = run({100 * MiB, -1, 10 * MiB});
  CHECK(r.stats.peak_reserved == 100 * MiB);
  CHECK(sizes(r.segments[0]) == std::vector<std::uint64_t>{10 * MiB, 90 * MiB});
}

TEST_CASE("max_split_size keeps oversize blocks whole and for requests within 20 MiB of them", "[allocator]") {
  Config c;
  c.max_split_size = 64 * MiB;
  // The cached 100 MiB block is oversize: a 10 MiB request does not take it (own 10 MiB segment).
  const Result small = run({100 * MiB, -1, 10 * MiB}, c);
  CHECK(small.stats.peak_reserved == 110 * MiB);
  // 90 MiB may take it (100 < 90 + 20) and it is not split: allocated counts 100 MiB.
  const Result near = run({100 * MiB, -1, 90 * MiB}, c);
  CHECK(near.stats.peak_reserved == 100 * MiB);
  CHECK(near.stats.allocated == 100 * MiB);
  // 70 MiB may not (100 >= 70 + 20): a new 70 MiB segment.
  const Result far = run({100 * MiB, -1, 70 * MiB}, c);
  CHECK(far.stats.peak_reserved == 170 * MiB);
  // ... unless max_non_split_rounding allows 40 MiB more.
  Config wide = c;
  wide.max_non_split_rounding = 40 * MiB;
  CHECK(run({100 * MiB, -1, 70 * MiB}, wide).stats.peak_reserved == 100 * MiB);
  // With a device limit, the cached oversize block is released before the new segment.
  c.device_limit = 150 * MiB;
  const Result freed = run({100 * MiB, -1, 70 * MiB}, c);
  CHECK_FALSE(freed.stats.oom);
  CHECK(freed.stats.retries == 0);
  CHECK(freed.stats.reserved == 70 * MiB);
}

TEST_CASE("roundup_power2_divisions rounds to the next of N steps between powers of two", "[allocator]") {
  Config c;
  c.roundup_power2_divisions.fill(4);
  CHECK(rounded_size(5 * MiB + 1, c) == 6 * MiB);     // steps of 1 MiB between 4 and 8 MiB
  CHECK(rounded_size(8 * MiB, c) == 8 * MiB);         // a power of two stays
  CHECK(rounded_size(MiB + 1, c) == MiB + MiB / 4);   // steps of 256 KiB between 1 and 2 MiB
  CHECK(rounded_size(3000, c) == 3072);               // steps of 512 B between 2 and 4 KiB
  CHECK(rounded_size(600, c) == 1024);                // <= 4 x 512 B: plain 512-byte rounding
  CHECK(rounded_size(5 * MiB + 1, {}) == 5 * MiB + 512);
  CHECK(run({5 * MiB + 1}, c).stats.peak_allocated == 6 * MiB);
  // Per interval: 8 divisions only for 4-8 MiB requests (index 2); others keep 512 B rounding.
  Config per;
  per.roundup_power2_divisions[2] = 8;
  CHECK(rounded_size(5 * MiB + 1, per) == 5 * MiB + MiB / 2);  // steps of 0.5 MiB
  CHECK(rounded_size(9 * MiB + 1, per) == 9 * MiB + 512);
  CHECK(rounded_size(MiB + 1, per) == MiB + 512);  // interval 0: no divisions -> 512 B rounding
}

TEST_CASE("expandable segments grow the free tail by 20 MiB pages instead of a new segment", "[allocator]") {
  Config c;
  c.expandable_segments = true;
  // 5 MiB maps one 20 MiB page (5 + 15 free). 30 MiB extends the 15 MiB tail by one more page:
  // 40 MiB mapped, where plain segments would hold 20 + 30 = 50 MiB.
  const Result r = run({5 * MiB, 30 * MiB}, c);
  CHECK(r.stats.peak_reserved == 40 * MiB);
  CHECK(r.stats.segments == 1);
  CHECK(run({5 * MiB, 30 * MiB}).stats.peak_reserved == 50 * MiB);
  // Any remainder of 512 B or more is split off with expandable segments.
  REQUIRE(r.segments.size() == 1);
  const std::vector<BlockView>& b = r.segments[0].blocks;
  REQUIRE(b.size() >= 3);
  CHECK(b[0].size == 5 * MiB);
  CHECK(b[1].size == 30 * MiB);
  CHECK(b[2].size == 5 * MiB);
  CHECK(b[2].mapped);
}

TEST_CASE("expandable segments unmap free pages before an out-of-memory", "[allocator]") {
  Config c;
  c.expandable_segments = true;
  c.device_limit = 60 * MiB;
  // 60 MiB of large pages mapped and freed; a small request needs a 2 MiB page of its own
  // pool, which does not fit until the free large pages are unmapped (and the empty large
  // segment released).
  const Result r = run({60 * MiB, -1, 1000}, c);
  CHECK_FALSE(r.stats.oom);
  CHECK(r.stats.retries == 1);
  CHECK(r.stats.peak_reserved == 60 * MiB);
  CHECK(r.stats.reserved == 2 * MiB);
  CHECK(r.stats.segments == 1);
  // A free run that still has to grow: 40 MiB freed, 10 MiB taken from its start, then 45 MiB
  // maps one more page behind the free 30 MiB (60 MiB mapped, no unmapping needed).
  const Result grow = run({40 * MiB, -1, 10 * MiB, 45 * MiB}, c);
  CHECK_FALSE(grow.stats.oom);
  CHECK(grow.stats.retries == 0);
  CHECK(grow.stats.peak_reserved == 60 * MiB);
  CHECK(grow.stats.allocated == 55 * MiB);
}

TEST_CASE("a trace that frees what is not live is rejected with a message", "[allocator]") {
  CHECK_THROWS_AS(run({1000, -1, -1}), memfit::Error);
  CHECK_THROWS_AS(run({-3}), memfit::Error);
}

TEST_CASE("PYTORCH_CUDA_ALLOC_CONF strings set the options the simulation follows", "[allocator]") {
  const Config none = config_from_alloc_conf("");
  CHECK_FALSE(none.expandable_segments);
  CHECK(none.max_split_size == kNoLimit);
  const Config c = config_from_alloc_conf("expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4");
  CHECK(c.expandable_segments);
  CHECK(c.max_split_size == 128 * MiB);
  CHECK(c.roundup_power2_divisions[0] == 4);
  CHECK(c.roundup_power2_divisions[15] == 4);
  // PyTorch raises max_split_size_mb to at least 20 (kLargeBuffer)
  CHECK(config_from_alloc_conf("max_split_size_mb:4").max_split_size == 20 * MiB);
  CHECK(config_from_alloc_conf("garbage_collection_threshold:0.6,max_non_split_rounding_mb:64").max_non_split_rounding == 64 * MiB);
  for (const char* bad : {"expandable_segments", "expandable_segments:yes", "max_split_size_mb:-1", "backend:cudaMallocAsync",
                          "roundup_power2_divisions:3", "roundup_power2_divisions:[256:1,>:8]"}) {
    INFO(bad);
    CHECK_THROWS_AS(config_from_alloc_conf(bad), memfit::Error);
  }
}

namespace {

/// A layer loop like the schedule's: each of `layers` iterations frees the previous layer's
/// output (6 MiB), keeps a 12 MiB tensor, uses two temporaries and leaves its own output.
/// `odd_last`: the last layer asks for a 5 MiB temporary instead of 4 MiB.
std::vector<std::int64_t> layer_trace(int layers, bool odd_last, size_t& first, size_t& length) {
  std::vector<std::int64_t> t;
  std::int64_t n = 0;
  auto alloc = [&](std::uint64_t bytes) { t.push_back(static_cast<std::int64_t>(bytes)); return n++; };
  auto release = [&](std::int64_t k) { t.push_back(-k - 1); };
  std::vector<std::int64_t> kept;
  std::int64_t out = alloc(6 * MiB);
  first = t.size();
  for (int l = 0; l < layers; ++l) {
    kept.push_back(alloc(12 * MiB));
    const std::int64_t a = alloc(odd_last && l == layers - 1 ? 5 * MiB : 4 * MiB), b = alloc(3 * MiB);
    release(out);
    out = alloc(6 * MiB);
    release(a);
    release(b);
  }
  length = (t.size() - first) / static_cast<size_t>(layers);
  for (auto k = kept.rbegin(); k != kept.rend(); ++k) release(*k);
  release(out);
  return t;
}

bool same(const Result& a, const Result& b) {
  const Stats &x = a.stats, &y = b.stats;
  bool eq = x.allocated == y.allocated && x.peak_allocated == y.peak_allocated && x.requested == y.requested &&
            x.peak_requested == y.peak_requested && x.reserved == y.reserved && x.peak_reserved == y.peak_reserved &&
            x.allocated_at_peak_reserved == y.allocated_at_peak_reserved && x.segments == y.segments &&
            x.peak_segments == y.peak_segments && x.device_allocs == y.device_allocs && a.segments.size() == b.segments.size();
  for (size_t i = 0; eq && i < a.segments.size(); ++i) eq = sizes(a.segments[i]) == sizes(b.segments[i]);
  return eq;
}

}  // namespace

TEST_CASE("the periodic shortcut copies repeating layers and gives the full simulation's result", "[allocator]") {
  size_t first = 0, length = 0;
  const auto events = events_from_signed(layer_trace(40, false, first, length));
  const Result full = simulate(events);
  const Result fast = simulate_periodic(events, {{first, length, 40}});
  CHECK(fast.periods_extrapolated == 1);
  CHECK(fast.events_skipped > 30 * length);
  CHECK(same(full, fast));
  // the first two kept tensors are carved out of the two 20 MiB segments, the 38 others get 12 MiB ones
  CHECK(full.stats.peak_reserved == 2 * 20 * MiB + 38 * 12 * MiB);
  for (const Config& c : {config_from_alloc_conf("max_split_size_mb:20"), config_from_alloc_conf("expandable_segments:True")})
    CHECK(same(simulate(events, c), simulate_periodic(events, {{first, length, 40}}, c)));
}

TEST_CASE("the periodic shortcut checks its hints: wrong periods or a differing layer change nothing", "[allocator]") {
  size_t first = 0, length = 0;
  const auto events = events_from_signed(layer_trace(40, false, first, length));
  const Result full = simulate(events);
  for (const Period& p : {Period{first + 1, length, 39}, Period{first, length + 1, 30}, Period{first, 2 * length, 20},
                          Period{0, length, 40}})
    CHECK(same(full, simulate_periodic(events, {p})));
  const auto odd = events_from_signed(layer_trace(40, true, first, length));
  const Result odd_fast = simulate_periodic(odd, {{first, length, 40}});
  CHECK(odd_fast.periods_extrapolated == 0);  // the last layer differs: every layer is simulated
  CHECK(same(simulate(odd), odd_fast));
  CHECK_THROWS_AS(simulate_periodic(events_from_signed({1000, 1000, 1000, -1, -1}), {{0, 1, 3}}), memfit::Error);
}

TEST_CASE("the periodic shortcut reads a compact trace in place, with the same result", "[allocator]") {
  size_t first = 0, length = 0;
  const std::vector<std::int64_t> compact = layer_trace(40, false, first, length);
  const Result in_place = simulate_periodic(compact, {{first, length, 40}});
  CHECK(in_place.periods_extrapolated == 1);
  CHECK(same(simulate(events_from_signed(compact)), in_place));
  CHECK_THROWS_AS(simulate_periodic(std::vector<std::int64_t>{1000, 0, -1}, {}), memfit::Error);  // 0: use events_from_signed
}
