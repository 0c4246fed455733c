// The caching-allocator simulation (allocator.hpp). The function names follow
// c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator: malloc, get_free_block,
// alloc_block, release_available_cached_blocks, release_cached_blocks, alloc_found_block,
// free_block, try_merge_blocks, find_expandable_block, map_block, unmap_block), so each rule
// can be checked against the source it comes from.
#include "memfit/allocator.hpp"

#include <algorithm>
#include <array>
#include <set>
#include <string>

#include "memfit/error.hpp"

namespace memfit::alloc {

namespace {

using u64 = std::uint64_t;
constexpr int kNone = -1;
// Segment addresses are synthetic; expandable segments reserve this much address space when
// no device limit is given (PyTorch reserves the device's total memory).
constexpr u64 kUnlimitedVirtual = u64{1} << 40;

struct Block {
  u64 ptr = 0, size = 0, requested = 0;
  int prev = kNone, next = kNone;
  int expandable = kNone;  ///< the expandable segment it belongs to, or kNone (a cudaMalloc segment)
  bool small = false, allocated = false, mapped = true;
};

/// Free blocks by (size, address), as a sorted vector: a step inserts and erases free blocks
/// tens of thousands of times among a few dozen, where a tree's node allocations cost more than
/// moving the tail of a flat array. The key is a plain struct so that moving the tail is one
/// memmove; (size, address) is unique among a pool's free blocks, the block index rides along.
struct FreeKey {
  u64 size = 0, ptr = 0;
  int block = kNone;
  friend bool operator<(const FreeKey& a, const FreeKey& b) { return a.size != b.size ? a.size < b.size : a.ptr < b.ptr; }
};

class FreeBlocks {
 public:
  using iterator = std::vector<FreeKey>::iterator;
  void emplace(u64 size, u64 ptr, int i) {
    const FreeKey k{size, ptr, i};
    keys_.insert(lower_bound(k), k);
  }
  void erase(const FreeKey& k) {
    const iterator it = lower_bound(k);
    if (it != keys_.end() && it->size == k.size && it->ptr == k.ptr) keys_.erase(it);
  }
  iterator erase(iterator it) { return keys_.erase(it); }
  /// Replaces the key at `it` by `k`: one shift of the keys between their places (the order an
  /// erase and an insert give, without moving the tail twice).
  void replace(iterator it, const FreeKey& k) {
    if (k < *it) {
      const iterator pos = std::lower_bound(keys_.begin(), it, k);
      std::move_backward(pos, it, it + 1);
      *pos = k;
    } else {
      const iterator pos = std::lower_bound(it + 1, keys_.end(), k);
      std::move(it + 1, pos, it);
      *(pos - 1) = k;
    }
  }
  iterator lower_bound(const FreeKey& k) { return std::lower_bound(keys_.begin(), keys_.end(), k); }
  iterator begin() { return keys_.begin(); }
  iterator end() { return keys_.end(); }
  [[nodiscard]] const std::vector<FreeKey>& keys() const { return keys_; }
  [[nodiscard]] bool empty() const { return keys_.empty(); }

 private:
  std::vector<FreeKey> keys_;
};

/// Free blocks by (size, address): lower_bound is the best fit. Unmapped ranges by address.
struct Pool {
  bool small = false;
  FreeBlocks free;
  std::set<std::pair<u64, int>> unmapped;
};

struct Sim {
  Config cfg;
  std::vector<Block> blocks;
  std::vector<int> spare;  ///< indexes of dead blocks, reused
  Pool small{true, {}, {}}, large{false, {}, {}};
  std::vector<int> live;   ///< allocation number -> block (kNone once freed)
  u64 next_address = kLargeBuffer;  ///< segment bases are multiples of 20 MiB (page-aligned)
  int expandable_segments = 0;
  Stats st;

  Pool& pool_of(const Block& b) { return b.small ? small : large; }
};

int new_block(Sim& s, const Block& b) {
  if (!s.spare.empty()) {
    const int i = s.spare.back();
    s.spare.pop_back();
    s.blocks[static_cast<size_t>(i)] = b;
    return i;
  }
  s.blocks.push_back(b);
  return static_cast<int>(s.blocks.size() - 1);
}

Block& at(Sim& s, int i) { return s.blocks[static_cast<size_t>(i)]; }

void insert_free(Sim& s, int i) {
  Block& b = at(s, i);
  if (b.mapped) s.pool_of(b).free.emplace(b.size, b.ptr, i);
  else s.pool_of(b).unmapped.emplace(b.ptr, i);
}

void erase_free(Sim& s, int i) {
  Block& b = at(s, i);
  if (b.mapped) s.pool_of(b).free.erase({b.size, b.ptr, i});
  else s.pool_of(b).unmapped.erase({b.ptr, i});
}

/// roundup_power2_next_division: the next of N equal steps between two powers of two.
u64 roundup_power2_next_division(u64 size, u64 divisions) {
  if (size <= 4 || divisions <= 1 || (size & (size - 1)) == 0) return size;
  u64 floor2 = u64{1} << (63 - __builtin_clzll(size));
  const u64 step = floor2 >> (63 - __builtin_clzll(divisions));
  if (step == 0) return floor2 << 1;
  const u64 down = size & ~(step - 1);
  return down == size ? size : down + step;
}

u64 allocation_size(u64 size) {  // get_allocation_size
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

bool should_split(const Sim& s, const Block& b, u64 size) {
  const u64 remaining = b.size - size;
  if (b.small || s.cfg.expandable_segments) return remaining >= kMinBlockSize;
  return size < s.cfg.max_split_size && remaining > kSmallSize;
}

u64 expandable_size(const Sim& s, const Block& b) {  // what a free tail block can grow to
  if (b.next == kNone) return b.size;
  const Block& next = s.blocks[static_cast<size_t>(b.next)];
  return b.size + (next.mapped ? 0 : next.size);
}

/// get_free_block: the smallest cached block that fits, within the oversize rules (left in the
/// free list: take_cached_block takes it out); end() if none.
FreeBlocks::iterator get_free_block(Sim& s, Pool& pool, u64 size) {
  auto it = pool.free.lower_bound({size, 0, kNone});
  if (it == pool.free.end()) return it;
  auto grows_to = [&](auto i) { return expandable_size(s, at(s, i->block)); };
  if (at(s, it->block).expandable != kNone) {
    // A free block that can still grow counts at the size it can grow to.
    for (auto next = std::next(it); next != pool.free.end() && grows_to(next) < grows_to(it); ++next) it = next;
  }
  const u64 found = it->size;
  if (size < s.cfg.max_split_size && found >= s.cfg.max_split_size) return pool.free.end();
  if (size >= s.cfg.max_split_size && found >= size + s.cfg.max_non_split_rounding) return pool.free.end();
  return it;
}

void note_reserved(Sim& s, u64 delta_plus, u64 delta_minus) {
  s.st.reserved = s.st.reserved + delta_plus - delta_minus;
  if (s.st.reserved > s.st.peak_reserved) {
    s.st.peak_reserved = s.st.reserved;
    s.st.allocated_at_peak_reserved = kNoLimit;  // filled in when the allocation completes
  }
}

bool fits_device(const Sim& s, u64 bytes) {
  return s.cfg.device_limit == kNoLimit || s.st.reserved + bytes <= s.cfg.device_limit;
}

/// alloc_block without expandable segments: one cudaMalloc of the pool's segment size.
int alloc_segment(Sim& s, Pool& pool, u64 alloc_size) {
  if (!fits_device(s, alloc_size)) return kNone;
  Block b;
  b.ptr = s.next_address;
  b.size = alloc_size;
  b.small = pool.small;
  s.next_address += (alloc_size + kLargeBuffer) / kLargeBuffer * kLargeBuffer;
  ++s.st.segments;
  ++s.st.device_allocs;
  s.st.peak_segments = std::max(s.st.peak_segments, s.st.segments);
  note_reserved(s, alloc_size, 0);
  return new_block(s, b);
}

/// `src`, a neighbour of `dst`, joins it (the free lists are the caller's business).
void merge_links(Sim& s, int dst, int src) {
  Block& d = at(s, dst);
  Block& o = at(s, src);
  if (d.prev == src) {
    d.ptr = o.ptr;
    d.prev = o.prev;
    if (d.prev != kNone) at(s, d.prev).next = dst;
  } else {
    d.next = o.next;
    if (d.next != kNone) at(s, d.next).prev = dst;
  }
  d.size += o.size;
  s.spare.push_back(src);
}

/// try_merge_blocks: `src` (a neighbour of `dst`) joins `dst` when it is free and equally mapped.
void try_merge(Sim& s, int dst, int src) {
  if (src == kNone) return;
  Block& d = at(s, dst);
  Block& o = at(s, src);
  if (o.allocated || o.mapped != d.mapped) return;
  erase_free(s, src);
  merge_links(s, dst, src);
}

u64 page_of(const Block& b) { return b.small ? kSmallBuffer : kLargeBuffer; }

/// find_expandable_block: the lowest free-or-unmapped run with `size` bytes of room, or a new
/// expandable segment (wholly unmapped) when there is none.
int find_expandable_block(Sim& s, Pool& pool, u64 size) {
  auto allocatable = [&](int i) { return i != kNone && !at(s, i).allocated; };
  for (const auto& [ptr, idx] : pool.unmapped) {
    int c = allocatable(at(s, idx).prev) ? at(s, idx).prev : idx;
    u64 room = 0;
    for (int b = c; room < size && allocatable(b); b = at(s, b).next) room += at(s, b).size;
    if (room >= size) return c;
  }
  const u64 page = pool.small ? kSmallBuffer : kLargeBuffer;
  const u64 virt = s.cfg.device_limit == kNoLimit ? kUnlimitedVirtual : (s.cfg.device_limit + page - 1) / page * page;
  Block b;
  b.ptr = s.next_address;
  b.size = virt;
  b.small = pool.small;
  b.mapped = false;
  b.expandable = s.expandable_segments++;
  s.next_address += (virt + kLargeBuffer) / kLargeBuffer * kLargeBuffer;
  ++s.st.segments;
  s.st.peak_segments = std::max(s.st.peak_segments, s.st.segments);
  const int i = new_block(s, b);
  insert_free(s, i);
  return i;
}

/// map_block: maps whole pages from the start of an unmapped range, merges with free neighbours.
bool map_block(Sim& s, int i, u64 size) {
  Block& b = at(s, i);
  const u64 page = page_of(b);
  const u64 mapped = std::min(b.size, (size + page - 1) / page * page);
  if (!fits_device(s, mapped)) return false;
  erase_free(s, i);
  if (mapped < b.size) {
    Block rest = b;
    rest.ptr = b.ptr + mapped;
    rest.size = b.size - mapped;
    rest.prev = i;
    const int r = new_block(s, rest);  // may reallocate: no references to blocks past here
    if (at(s, r).next != kNone) at(s, at(s, r).next).prev = r;
    at(s, i).next = r;
    at(s, i).size = mapped;
    insert_free(s, r);
  }
  at(s, i).mapped = true;
  try_merge(s, i, at(s, i).prev);
  try_merge(s, i, at(s, i).next);
  insert_free(s, i);
  ++s.st.device_allocs;
  note_reserved(s, mapped, 0);
  return true;
}

/// try_allocate_expandable_block: maps pages until a free run of `size` bytes exists.
int try_allocate_expandable(Sim& s, Pool& pool, u64 size) {
  int c = find_expandable_block(s, pool, size);
  if (!at(s, c).mapped && !map_block(s, c, std::min(at(s, c).size, size))) return kNone;
  while (at(s, c).size < size) {
    const int next = at(s, c).next;
    if (!map_block(s, next, std::min(size - at(s, c).size, at(s, next).size))) return kNone;
    c = next;  // map_block merged the free `c` into `next`
  }
  erase_free(s, c);
  return c;
}

/// release_block: cudaFree of a wholly free segment.
void release_block(Sim& s, int i) {
  erase_free(s, i);
  --s.st.segments;
  ++s.st.device_frees;
  note_reserved(s, 0, at(s, i).size);
  s.spare.push_back(i);
}

/// unmap_block: unmaps the whole pages inside a free block of an expandable segment.
void unmap_block(Sim& s, int i) {
  const Block b = at(s, i);
  const u64 page = page_of(b);
  const u64 begin = (b.ptr + page - 1) / page * page, end = (b.ptr + b.size) / page * page;
  if (end <= begin) return;
  erase_free(s, i);
  auto split_off = [&](u64 ptr, u64 size, bool before) {
    Block part = b;
    part.ptr = ptr;
    part.size = size;
    const int p = new_block(s, part);
    Block& me = at(s, i);
    if (before) {
      at(s, p).prev = me.prev;
      at(s, p).next = i;
      if (me.prev != kNone) at(s, me.prev).next = p;
      me.prev = p;
    } else {
      at(s, p).prev = i;
      at(s, p).next = me.next;
      if (me.next != kNone) at(s, me.next).prev = p;
      me.next = p;
    }
    insert_free(s, p);
  };
  if (begin > b.ptr) split_off(b.ptr, begin - b.ptr, true);
  if (b.ptr + b.size > end) split_off(end, b.ptr + b.size - end, false);
  at(s, i).ptr = begin;
  at(s, i).size = end - begin;
  at(s, i).mapped = false;
  try_merge(s, i, at(s, i).prev);
  try_merge(s, i, at(s, i).next);
  ++s.st.device_frees;
  note_reserved(s, 0, end - begin);
  if (at(s, i).prev == kNone && at(s, i).next == kNone) {  // release_expandable_segment
    --s.st.segments;
    s.spare.push_back(i);
  } else {
    insert_free(s, i);
  }
}

/// release_cached_blocks: every wholly free segment (expandable: every free page) goes back.
void release_cached_blocks(Sim& s) {
  for (Pool* pool : {&s.large, &s.small}) {
    std::vector<int> candidates;
    for (const auto& e : pool->free) candidates.push_back(e.block);
    for (int i : candidates) {
      const Block& b = at(s, i);
      if (b.expandable != kNone) unmap_block(s, i);
      else if (b.prev == kNone && b.next == kNone) release_block(s, i);
    }
  }
}

/// release_available_cached_blocks: with max_split_size set, frees oversize cached segments
/// (the smallest one that is large enough, else the largest ones) before a retry.
bool release_available_cached_blocks(Sim& s, Pool& pool, u64 size) {
  if (s.cfg.max_split_size == kNoLimit) return false;
  const u64 key = std::max(size, s.cfg.max_split_size);
  auto whole = [&](int i) { return at(s, i).prev == kNone && at(s, i).next == kNone && at(s, i).expandable == kNone; };
  auto it = pool.free.lower_bound({key, 0, kNone});
  if (it != pool.free.end()) {
    if (!whole(it->block)) return false;
    release_block(s, it->block);
    return true;
  }
  u64 released = 0;
  while (released < key && !pool.free.empty()) {
    const auto last = std::prev(pool.free.end());
    if (last->size < s.cfg.max_split_size || !whole(last->block)) break;
    released += last->size;
    release_block(s, last->block);
  }
  return released >= key;
}

int alloc_block(Sim& s, Pool& pool, u64 size) {
  if (s.cfg.expandable_segments) return try_allocate_expandable(s, pool, size);
  return alloc_segment(s, pool, allocation_size(size));
}

/// Splits block i after `size` bytes; returns the remainder (not yet in a free list).
int split_block(Sim& s, int i, u64 size) {
  Block rest = at(s, i);
  rest.ptr += size;
  rest.size -= size;
  rest.prev = i;
  const int r = new_block(s, rest);
  if (at(s, r).next != kNone) at(s, at(s, r).next).prev = r;
  at(s, i).next = r;
  at(s, i).size = size;
  return r;
}

/// A cached block found by get_free_block leaves the free list; when the split rules allow, its
/// remainder takes its key's place there (the same order as an erase and an insert).
int take_cached_block(Sim& s, Pool& pool, FreeBlocks::iterator it, u64 size) {
  const int i = it->block;
  if (!should_split(s, at(s, i), size)) {
    pool.free.erase(it);
    return i;
  }
  const int r = split_block(s, i, size);
  pool.free.replace(it, {at(s, r).size, at(s, r).ptr, r});
  return i;
}

/// alloc_found_block: splits off the remainder when the split rules allow, marks it allocated.
int alloc_found_block(Sim& s, int i, u64 size, u64 requested) {
  if (should_split(s, at(s, i), size)) insert_free(s, split_block(s, i, size));
  Block& b = at(s, i);
  b.allocated = true;
  b.requested = requested;
  s.st.allocated += b.size;
  s.st.requested += requested;
  s.st.peak_allocated = std::max(s.st.peak_allocated, s.st.allocated);
  s.st.peak_requested = std::max(s.st.peak_requested, s.st.requested);
  if (s.st.allocated_at_peak_reserved == kNoLimit) s.st.allocated_at_peak_reserved = s.st.allocated;
  return i;
}

/// malloc: search the pool, else a new segment, else release the cache and retry; kNone = OOM.
int malloc_block(Sim& s, u64 requested) {
  const u64 size = rounded_size(requested, s.cfg);
  Pool& pool = size <= kSmallSize ? s.small : s.large;
  const auto cached = get_free_block(s, pool, size);
  int i = cached == pool.free.end() ? kNone : take_cached_block(s, pool, cached, size);
  if (i == kNone) i = alloc_block(s, pool, size);
  if (i == kNone && release_available_cached_blocks(s, pool, size)) i = alloc_block(s, pool, size);
  if (i == kNone) {
    ++s.st.retries;
    release_cached_blocks(s);
    i = alloc_block(s, pool, size);
  }
  return i == kNone ? kNone : alloc_found_block(s, i, size, requested);
}

/// free + free_block: the block returns to its pool, merged with free neighbours. The merged
/// block's key takes the place of the first merged neighbour's key in the free list.
void free_block(Sim& s, int i) {
  Block& b = at(s, i);
  b.allocated = false;
  s.st.allocated -= b.size;
  s.st.requested -= b.requested;
  auto merges = [&](int o) { return o != kNone && !at(s, o).allocated && at(s, o).mapped; };
  const int first = merges(b.prev) ? b.prev : merges(b.next) ? b.next : kNone;
  if (first == kNone) {
    insert_free(s, i);
    return;
  }
  const bool previous_first = first == b.prev;
  const FreeKey slot{at(s, first).size, at(s, first).ptr, first};
  merge_links(s, i, first);
  if (previous_first) try_merge(s, i, at(s, i).next);
  FreeBlocks& list = s.pool_of(at(s, i)).free;
  list.replace(list.lower_bound(slot), {at(s, i).size, at(s, i).ptr, i});
}

std::vector<SegmentView> segment_views(Sim& s) {
  std::vector<std::pair<u64, int>> heads;
  std::vector<bool> dead(s.blocks.size(), false);
  for (int i : s.spare) dead[static_cast<size_t>(i)] = true;
  for (size_t i = 0; i < s.blocks.size(); ++i)
    if (!dead[i] && s.blocks[i].prev == kNone) heads.emplace_back(s.blocks[i].ptr, static_cast<int>(i));
  std::sort(heads.begin(), heads.end());
  std::vector<SegmentView> out;
  for (const auto& [ptr, head] : heads) {
    SegmentView v;
    v.small_pool = at(s, head).small;
    for (int b = head; b != kNone; b = at(s, b).next) v.blocks.push_back({at(s, b).size, at(s, b).allocated, at(s, b).mapped});
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace

std::vector<Event> events_from_signed(const std::vector<std::int64_t>& trace) {
  std::vector<Event> out;
  out.reserve(trace.size());
  for (std::int64_t v : trace) {
    if (v > 0) out.push_back({false, static_cast<u64>(v)});
    else if (v < 0) out.push_back({true, static_cast<u64>(-(v + 1))});
  }
  return out;
}

u64 rounded_size(u64 bytes, const Config& c) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  // CUDAAllocatorConfig::roundup_power2_divisions(size): intervals of powers of two from 1 MiB.
  const int log2_size = 63 - __builtin_clzll(bytes);
  const size_t interval = static_cast<size_t>(std::clamp(log2_size - 20, 0, 15));
  const u64 div = c.roundup_power2_divisions[interval];
  if (div > 1 && bytes > kMinBlockSize * div) return roundup_power2_next_division(bytes, div);
  return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

namespace {

u64 conf_number(const std::string& key, const std::string& value) {
  if (value.empty() || value.size() > 12 || value.find_first_not_of("0123456789") != std::string::npos)
    throw Error("runtime.alloc_conf: " + key + " needs a whole number, got \"" + value + "\"");
  return std::stoull(value);
}

bool conf_bool(const std::string& key, const std::string& value) {
  if (value == "True" || value == "true" || value == "1") return true;
  if (value == "False" || value == "false" || value == "0") return false;
  throw Error("runtime.alloc_conf: " + key + " is True or False, got \"" + value + "\"");
}

/// One key:value option of PYTORCH_CUDA_ALLOC_CONF (c10/cuda/CUDAAllocatorConfig.cpp parseArgs).
void apply_conf_option(Config& c, const std::string& key, const std::string& value) {
  if (key == "expandable_segments") c.expandable_segments = conf_bool(key, value);
  else if (key == "max_split_size_mb") c.max_split_size = std::max<u64>(conf_number(key, value), 20) << 20;  // PyTorch: at least kLargeBuffer
  else if (key == "max_non_split_rounding_mb") c.max_non_split_rounding = conf_number(key, value) << 20;
  else if (key == "roundup_power2_divisions") {
    if (value.starts_with("["))
      throw Error("runtime.alloc_conf: roundup_power2_divisions per size range ([256:1,...]) is not simulated; give one number");
    const u64 d = conf_number(key, value);
    if (d != 0 && (d & (d - 1)) != 0) throw Error("runtime.alloc_conf: roundup_power2_divisions must be a power of 2");
    c.roundup_power2_divisions.fill(static_cast<std::uint32_t>(d));
  } else if (key != "garbage_collection_threshold") {
    throw Error("runtime.alloc_conf: option \"" + key + "\" is not simulated; supported: expandable_segments, "
                "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold");
  }
}

}  // namespace

Config config_from_alloc_conf(const std::string& conf) {
  Config c;
  size_t start = 0;
  while (start < conf.size()) {
    size_t end = conf.find(',', start);
    if (conf.find('[', start) < end) end = conf.find(',', conf.find(']', start));  // a bracketed list holds commas
    const std::string option = conf.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const size_t colon = option.find(':');
    if (colon == std::string::npos)
      throw Error("runtime.alloc_conf: \"" + option + "\" is not key:value (PYTORCH_CUDA_ALLOC_CONF syntax)");
    apply_conf_option(c, option.substr(0, colon), option.substr(colon + 1));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return c;
}

namespace {

/// A trace, either as Events or in the compact signed form (with no 0 entries), read in place.
class Trace {
 public:
  explicit Trace(const std::vector<Event>& t) : events_(t.data()), size_(t.size()) {}
  explicit Trace(const std::vector<std::int64_t>& t) : compact_(t.data()), size_(t.size()) {}
  [[nodiscard]] size_t size() const { return size_; }
  Event operator[](size_t n) const {
    if (events_) return events_[n];
    const std::int64_t v = compact_[n];
    return v > 0 ? Event{false, static_cast<u64>(v)} : Event{true, static_cast<u64>(-(v + 1))};
  }

 private:
  const Event* events_ = nullptr;
  const std::int64_t* compact_ = nullptr;
  size_t size_ = 0;
};

/// Events [begin, end) of a trace; false at an out-of-memory (recorded in the stats). One function
/// with its loop: the per-event work is the simulation's hot path.
bool apply_events(Sim& s, const Trace& trace, size_t begin, size_t end) {
  for (size_t n = begin; n < end; ++n) {
    const Event e = trace[n];
    if (!e.free) {
      const int i = malloc_block(s, e.value);
      if (i == kNone) {
        s.st.oom = true;
        s.st.oom_event = n;
        s.st.oom_bytes = e.value;
        return false;
      }
      s.live.push_back(i);
      continue;
    }
    if (e.value >= s.live.size() || s.live[e.value] == kNone)
      throw Error("allocation trace: event " + std::to_string(n) + " frees allocation " + std::to_string(e.value) +
                  ", which is not live (a trace lists each allocation once, then its one free)");
    free_block(s, s.live[e.value]);
    s.live[e.value] = kNone;
  }
  return true;
}

/// The result; `views` false leaves out the segments (the estimator reads the stats only, and
/// walking some hundreds of segments into vectors cost more than the last of the replay).
Result finish(Sim& s, bool views = true) {
  if (s.st.allocated_at_peak_reserved == kNoLimit) s.st.allocated_at_peak_reserved = s.st.allocated;
  return {s.st, views ? segment_views(s) : std::vector<SegmentView>{}};
}

}  // namespace

Result simulate(const std::vector<Event>& trace, const Config& c) {
  Sim s;
  s.cfg = c;
  s.live.reserve(trace.size());
  apply_events(s, Trace(trace), 0, trace.size());
  return finish(s);
}

// The periodic shortcut. Why extrapolating is exact:
// Split the state at the start of an iteration into RELEVANT blocks -- cached free blocks,
// unmapped ranges of expandable segments, and the allocated blocks the iteration frees without
// having allocated them ("pending", each known by the position of its free in the iteration) --
// and INERT blocks, every other allocated block. An inert block is not freed during the
// iteration, so it is never searched, split or merged; it only stops its neighbours' merges, as
// any allocated block does. Every decision of the allocator (best fit by size then address,
// splits, merges, new segments at next_address above every existing one, pages mapped from an
// unmapped range) reads the relevant blocks, the allocated/free state of their neighbours, the
// pool, the config and next_address; with no device limit nothing is ever released.
// Let iterations k and k+1 be isomorphic (same requests; frees of their own allocations at the
// same relative numbers; frees of older allocations at the same positions) and the relevant
// blocks at the start of k+1 equal those at the start of k (addresses, sizes, mapping; pending:
// requested bytes and freeing position). Then k+1 takes k's decisions one for one, its new
// segments lying d = next_address(k+1) - next_address(k) higher: old blocks compare with the same
// old blocks, new ones lie above all old ones in both, and keep their order among themselves. So
// k+1 leaves the old segments as k left them, except that the pending blocks now hold k+1's
// allocations, and adds copies of k's new segments d higher, which hold only inert blocks (a
// relevant block there would have had an address no start state had). The start of k+2 then has
// the relevant blocks of the start of k+1 again, as long as k+2 frees, at each position that
// frees an older allocation, k+1's allocation of the number k+1 freed of k there; by induction,
// every later iteration repeats k. The shortcut checks exactly these conditions (relevant blocks
// equal; every later iteration isomorphic, its older frees D allocations on; no block allocated in
// k left live but inert in an old segment), copies k's new segments once per remaining iteration
// (d higher, allocation numbers D higher), renumbers the pending blocks, and adds k's changes to
// the counters. Allocated and requested bytes move by the same amount each iteration and rise by
// the same amount within it, so the peak is the highest start plus k's rise; reserved only grows.

namespace {

/// The state at the start of an iteration, as far as the shortcut compares and extrapolates it.
struct Boundary {
  bool valid = false;  ///< false: the iteration frees an allocation that is not live
  std::vector<FreeKey> free_small, free_large;      ///< cached blocks, in free-list order
  std::vector<std::pair<u64, u64>> unmapped;        ///< (address, size) of unmapped ranges
  std::vector<std::array<u64, 3>> pending;          ///< (address, size, requested) by freeing position
  std::vector<size_t> pending_ids;                  ///< their allocation numbers
  std::vector<size_t> pending_at;                   ///< the positions of their frees in the iteration
  Stats st;
  u64 next_address = 0;
  int expandable_segments = 0;
  size_t allocations = 0;  ///< allocations before the iteration
};

bool same_keys(const std::vector<FreeKey>& a, const std::vector<FreeKey>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const FreeKey& x, const FreeKey& y) { return x.size == y.size && x.ptr == y.ptr; });
}

bool same_relevant(const Boundary& a, const Boundary& b) {
  return a.valid && b.valid && same_keys(a.free_small, b.free_small) && same_keys(a.free_large, b.free_large) &&
         a.unmapped == b.unmapped && a.pending == b.pending && a.pending_at == b.pending_at;
}

/// Fills `b` (its buffers reused) with the state at the start of the iteration at `begin`.
void boundary_at(Sim& s, const Trace& trace, size_t begin, size_t length, Boundary& b) {
  b.valid = false;
  b.st = s.st;
  b.next_address = s.next_address;
  b.expandable_segments = s.expandable_segments;
  b.allocations = s.live.size();
  b.free_small.assign(s.small.free.keys().begin(), s.small.free.keys().end());
  b.free_large.assign(s.large.free.keys().begin(), s.large.free.keys().end());
  b.unmapped.clear();
  for (const Pool* pool : {&s.small, &s.large})
    for (const auto& [ptr, i] : pool->unmapped) b.unmapped.emplace_back(ptr, at(s, i).size);
  b.pending.clear();
  b.pending_ids.clear();
  b.pending_at.clear();
  for (size_t p = 0; p < length; ++p) {
    const Event e = trace[begin + p];
    if (!e.free || e.value >= b.allocations) continue;
    if (s.live[e.value] == kNone) return;
    const Block& blk = at(s, s.live[e.value]);
    b.pending.push_back({blk.ptr, blk.size, blk.requested});
    b.pending_ids.push_back(e.value);
    b.pending_at.push_back(p);
  }
  b.valid = true;
}

/// Whether iterations k+1 .. n-1 of the period repeat iteration k: the same requests, frees of
/// their own allocations at the same relative numbers, and frees of older allocations that take,
/// from iteration j-1, the allocation of the number iteration k+1 took from k.
bool iterations_repeat(const Trace& t, const Period& p, size_t k, size_t base_k, size_t allocs) {
  auto ev = [&](size_t j, size_t pos) { return t[p.first + j * p.length + pos]; };
  for (size_t pos = 0; pos < p.length; ++pos) {
    const Event ek = ev(k, pos);
    const Event e1 = ev(k + 1, pos);
    const bool older = ek.free && ek.value < base_k;
    if (older && (!e1.free || e1.value < base_k || e1.value >= base_k + allocs)) return false;
    for (size_t j = k + 1; j < p.iterations; ++j) {
      const Event ej = ev(j, pos);
      if (ej.free != ek.free) return false;
      const u64 want = !ek.free ? ek.value : older ? e1.value + (j - k - 1) * allocs : ek.value + (j - k) * allocs;
      if (ej.value != want) return false;
    }
  }
  return true;
}

/// Iteration k's allocations still live at the start of k+1 that lie in the segments k created:
/// `fresh` (block, allocation number) by address, `links` their (prev, next) as positions in
/// `fresh`. False unless the new segments hold only these and every other allocation of k left
/// live is a pending block of k+1.
bool fresh_blocks(Sim& s, const Boundary& k, const Boundary& k1, std::vector<std::pair<int, size_t>>& fresh,
                  std::vector<std::pair<int, int>>& links) {
  size_t live_from_k = 0;
  for (size_t id = k.allocations; id < k1.allocations; ++id) {
    const int i = s.live[id];
    if (i == kNone) continue;
    ++live_from_k;
    if (at(s, i).ptr >= k.next_address) fresh.emplace_back(i, id);
  }
  std::sort(fresh.begin(), fresh.end(), [&](const auto& a, const auto& b) { return at(s, a.first).ptr < at(s, b.first).ptr; });
  auto position = [&](int block) {
    for (size_t f = 0; f < fresh.size(); ++f)
      if (fresh[f].first == block) return static_cast<int>(f);
    return kNone;
  };
  for (const auto& [i, id] : fresh) {
    const int prev = at(s, i).prev, next = at(s, i).next;
    links.emplace_back(prev == kNone ? kNone : position(prev), next == kNone ? kNone : position(next));
    if ((prev != kNone && links.back().first == kNone) || (next != kNone && links.back().second == kNone)) return false;
  }
  return live_from_k == fresh.size() + k1.pending.size();
}

u64 shifted(u64 start, std::int64_t delta, u64 times) {
  return static_cast<u64>(static_cast<std::int64_t>(start) + delta * static_cast<std::int64_t>(times));
}

/// Copies iteration k's new segments `m` times, `d` bytes of address and `allocs` numbers apart.
void copy_fresh(Sim& s, const std::vector<std::pair<int, size_t>>& fresh, const std::vector<std::pair<int, int>>& links,
                u64 d, size_t allocs, size_t m) {
  std::vector<int> copy(fresh.size());
  for (size_t t = 1; t <= m; ++t) {
    for (size_t f = 0; f < fresh.size(); ++f) {
      Block b = at(s, fresh[f].first);
      b.ptr += d * t;
      copy[f] = new_block(s, b);
      s.live[fresh[f].second + t * allocs] = copy[f];
    }
    for (size_t f = 0; f < fresh.size(); ++f) {
      at(s, copy[f]).prev = links[f].first == kNone ? kNone : copy[static_cast<size_t>(links[f].first)];
      at(s, copy[f]).next = links[f].second == kNone ? kNone : copy[static_cast<size_t>(links[f].second)];
    }
  }
}

/// Adds m more iterations like k (start `k`, end `k1`) to the counters; `rise_*`: k's peak above its start.
void extend_stats(Stats& st, const Stats& k, const Stats& k1, u64 rise_allocated, u64 rise_requested, u64 m) {
  const std::int64_t da = static_cast<std::int64_t>(k1.allocated) - static_cast<std::int64_t>(k.allocated);
  const std::int64_t dq = static_cast<std::int64_t>(k1.requested) - static_cast<std::int64_t>(k.requested);
  const u64 top_allocated = shifted(k1.allocated, da, da > 0 ? m - 1 : 0), top_requested = shifted(k1.requested, dq, dq > 0 ? m - 1 : 0);
  st.allocated = shifted(k1.allocated, da, m);
  st.requested = shifted(k1.requested, dq, m);
  st.peak_allocated = std::max(st.peak_allocated, top_allocated + rise_allocated);
  st.peak_requested = std::max(st.peak_requested, top_requested + rise_requested);
  const u64 dr = k1.reserved - k.reserved;  // reserved never shrinks without a device limit
  st.reserved += dr * m;
  st.peak_reserved = std::max(st.peak_reserved, st.reserved);
  if (dr > 0) st.allocated_at_peak_reserved = shifted(k1.allocated_at_peak_reserved, da, m);
  st.segments += (k1.segments - k.segments) * m;
  st.peak_segments = std::max(st.peak_segments, st.segments);
  st.device_allocs += (k1.device_allocs - k.device_allocs) * m;
  st.device_frees += (k1.device_frees - k.device_frees) * m;
  st.retries += (k1.retries - k.retries) * m;
}

/// Applies the iterations after k+1's start (m of them) as repeats of k; false (nothing changed)
/// when the state is not what the argument above needs.
bool extrapolate(Sim& s, const Boundary& k, const Boundary& k1, u64 rise_allocated, u64 rise_requested, size_t m) {
  const size_t allocs = k1.allocations - k.allocations;
  std::vector<std::pair<int, size_t>> fresh;
  std::vector<std::pair<int, int>> links;
  if (k1.expandable_segments != k.expandable_segments || !fresh_blocks(s, k, k1, fresh, links)) return false;
  s.live.resize(k1.allocations + m * allocs, kNone);
  copy_fresh(s, fresh, links, k1.next_address - k.next_address, allocs, m);
  for (size_t id : k1.pending_ids) {
    s.live[id + m * allocs] = s.live[id];
    s.live[id] = kNone;
  }
  s.next_address += (k1.next_address - k.next_address) * m;
  extend_stats(s.st, k.st, k1.st, rise_allocated, rise_requested, m);
  return true;
}

/// The peaks of allocated and requested bytes within one iteration (the outer ones kept apart).
struct LocalPeaks {
  u64 outer_allocated = 0, outer_requested = 0, start_allocated = 0, start_requested = 0;
  void open(Stats& st) {
    outer_allocated = st.peak_allocated, outer_requested = st.peak_requested;
    start_allocated = st.allocated, start_requested = st.requested;
    st.peak_allocated = st.allocated, st.peak_requested = st.requested;
  }
  /// Restores the outer peaks; returns the rises above the iteration's start.
  std::pair<u64, u64> close(Stats& st) const {
    const std::pair<u64, u64> rise{st.peak_allocated - start_allocated, st.peak_requested - start_requested};
    st.peak_allocated = std::max(outer_allocated, st.peak_allocated);
    st.peak_requested = std::max(outer_requested, st.peak_requested);
    return rise;
  }
};

/// A period's iterations one by one, comparing each start with the previous one and extrapolating
/// the rest once they repeat. False at an out-of-memory.
bool run_period(Sim& s, const Trace& trace, const Period& p, Result& r) {
  Boundary previous, now;  // reused: no allocation per layer once their buffers have grown
  LocalPeaks peaks;
  std::pair<u64, u64> rise{0, 0};
  std::array<size_t, 3> counts{}, previous_counts{};
  for (size_t j = 0; j < p.iterations; ++j) {
    const size_t begin = p.first + j * p.length;
    if (j > 0) rise = peaks.close(s.st);
    // equal states have equally many cached and unmapped blocks: the full state is taken only then
    counts = {s.small.free.keys().size(), s.large.free.keys().size(), s.small.unmapped.size() + s.large.unmapped.size()};
    now.valid = false;
    if (j > 0 && counts == previous_counts) {
      boundary_at(s, trace, begin, p.length, now);
      if (same_relevant(previous, now) &&
          iterations_repeat(trace, p, j - 1, previous.allocations, now.allocations - previous.allocations) &&
          extrapolate(s, previous, now, rise.first, rise.second, p.iterations - j)) {
        ++r.periods_extrapolated;
        r.events_skipped += (p.iterations - j) * p.length;
        return true;
      }
    }
    peaks.open(s.st);
    if (!apply_events(s, trace, begin, begin + p.length)) {
      peaks.close(s.st);
      return false;
    }
    std::swap(previous, now);
    previous_counts = counts;
  }
  peaks.close(s.st);
  ++r.periods_simulated;
  return true;
}

}  // namespace

namespace {

Result periodic(const Trace& trace, const std::vector<Period>& periods, const Config& c, bool views) {
  Sim s;
  s.cfg = c;
  s.live.reserve(trace.size());
  Result r;
  size_t n = 0;
  bool ok = true;
  for (const Period& p : periods) {
    if (p.first < n || p.iterations < 3 || p.length == 0 || p.first + p.length * p.iterations > trace.size()) continue;
    ok = apply_events(s, trace, n, p.first) && run_period(s, trace, p, r);
    if (!ok) break;
    n = p.first + p.length * p.iterations;
  }
  if (ok) apply_events(s, trace, n, trace.size());
  Result done = finish(s, views);
  done.periods_extrapolated = r.periods_extrapolated;
  done.periods_simulated = r.periods_simulated;
  done.events_skipped = r.events_skipped;
  return done;
}

}  // namespace

Result simulate_periodic(const std::vector<Event>& trace, const std::vector<Period>& periods, const Config& c) {
  if (c.device_limit != kNoLimit) return simulate(trace, c);  // releases break the argument
  return periodic(Trace(trace), periods, c, true);
}

Result simulate_periodic(const std::vector<std::int64_t>& trace, const std::vector<Period>& periods, const Config& c) {
  if (std::find(trace.begin(), trace.end(), 0) != trace.end())
    throw Error("simulate_periodic: a compact trace with 0 entries (empty tensors) must go through events_from_signed");
  if (c.device_limit != kNoLimit) return simulate(events_from_signed(trace), c);
  return periodic(Trace(trace), periods, c, true);
}

Stats periodic_stats(const std::vector<std::int64_t>& trace, const std::vector<Period>& periods, const Config& c) {
  if (std::find(trace.begin(), trace.end(), 0) != trace.end())
    throw Error("periodic_stats: a compact trace with 0 entries (empty tensors) must go through events_from_signed");
  if (c.device_limit != kNoLimit) return simulate(events_from_signed(trace), c).stats;
  return periodic(Trace(trace), periods, c, false).stats;
}

}  // namespace memfit::alloc
