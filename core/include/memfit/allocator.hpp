// A simulation of PyTorch's CUDA caching allocator (the "native" backend of
// c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x), for one device and one stream.
//
// It replays a sequence of allocations and frees and reports what torch.cuda would report for
// that sequence: max_memory_allocated (block bytes, so with the 512-byte rounding and the
// unsplit tails of reused blocks), max_memory_reserved (bytes held in cudaMalloc'd segments or
// mapped pages of expandable segments), and whether and where it runs out of memory.
//
// The rules, with the constants of the source:
//  - every request is rounded up to a multiple of 512 B (kMinBlockSize), or to the next
//    1/N power-of-two division when roundup_power2_divisions N > 1 applies to it;
//  - requests <= 1 MiB (kSmallSize) use the small pool, carved from 2 MiB segments
//    (kSmallBuffer); larger ones use the large pool: 20 MiB segments (kLargeBuffer) for
//    requests < 10 MiB (kMinLargeAlloc), else the request rounded up to 2 MiB (kRoundLarge);
//  - a request takes the smallest cached free block that fits (best fit by size, then address);
//    a block is split when the remainder is >= 512 B (small pool, or any pool with expandable
//    segments) or > 1 MiB (large pool), and never when the request is >= max_split_size;
//    a request below max_split_size never takes a cached block >= max_split_size, and one at
//    or above it never takes a block max_non_split_rounding (20 MiB) or more larger than itself;
//  - a freed block merges with its free neighbours in the same segment;
//  - when no cached block fits, a new segment is allocated; when that would pass the device
//    limit, cached oversize blocks are released (only with max_split_size set), then every
//    wholly free segment (expandable: every free page) is released, and the allocation is
//    retried once more before an out-of-memory;
//  - expandable_segments: one growing segment per pool, mapped in pages of 20 MiB (large
//    pool) or 2 MiB (small pool); the allocator extends the free tail instead of allocating a
//    new segment.
// Not modelled: several streams (record_stream, cross-stream reuse), CUDA graph pools,
// garbage_collection_threshold, the free-memory callbacks, and the addresses cudaMalloc
// returns (new segments get increasing addresses, which only breaks ties between equal sizes).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace memfit::alloc {

inline constexpr std::uint64_t kMinBlockSize = 512;
inline constexpr std::uint64_t kSmallSize = 1 << 20;
inline constexpr std::uint64_t kSmallBuffer = 2 << 20;
inline constexpr std::uint64_t kLargeBuffer = 20 << 20;
inline constexpr std::uint64_t kMinLargeAlloc = 10 << 20;
inline constexpr std::uint64_t kRoundLarge = 2 << 20;
inline constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();

/// PYTORCH_CUDA_ALLOC_CONF options the simulation follows, plus the device's memory limit.
struct Config {
  std::uint64_t max_split_size = kNoLimit;    ///< max_split_size_mb x 2^20; kNoLimit = unset
  /// max_non_split_rounding_mb x 2^20: how much larger than an oversize request (>= max_split_size)
  /// a cached oversize block may be and still serve it (PyTorch's default: kLargeBuffer).
  std::uint64_t max_non_split_rounding = kLargeBuffer;
  /// roundup_power2_divisions per power-of-two interval of the request size: [0] for sizes below
  /// 2 MiB, [1] for 2-4 MiB, ... [15] for 32 GiB and above ("[256:1,512:2,>:8]" sets ranges of
  /// them; a single number sets all). 0 or 1 = plain 512-byte rounding.
  std::array<std::uint32_t, 16> roundup_power2_divisions{};
  bool expandable_segments = false;
  std::uint64_t device_limit = kNoLimit;      ///< bytes the allocator may hold before cudaMalloc fails
};

/// The options of a PYTORCH_CUDA_ALLOC_CONF string ("expandable_segments:True,max_split_size_mb:128"):
/// expandable_segments, max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions (one
/// number for every size) and garbage_collection_threshold (accepted, not simulated: it only acts
/// near a memory fraction limit). "" = PyTorch's defaults. Anything else is an error that lists them.
[[nodiscard]] Config config_from_alloc_conf(const std::string& conf);

/// One step of a trace. Allocation k (counting allocations from 0) is freed by {free, k}.
struct Event {
  bool free = false;
  std::uint64_t value = 0;  ///< alloc: requested bytes; free: the allocation's number
};

/// Compact trace: n > 0 allocates n bytes; -k - 1 frees allocation k. 0 is ignored (PyTorch
/// hands out no memory for an empty tensor).
std::vector<Event> events_from_signed(const std::vector<std::int64_t>& trace);

/// What torch.cuda.memory_stats would say after the trace.
struct Stats {
  std::uint64_t allocated = 0, peak_allocated = 0;  ///< block bytes ("allocated_bytes.all")
  std::uint64_t requested = 0, peak_requested = 0;  ///< bytes asked for ("requested_bytes.all")
  std::uint64_t reserved = 0, peak_reserved = 0;    ///< segment / mapped bytes ("reserved_bytes.all")
  /// Block bytes allocated at the moment the reserved peak was first reached: reserved minus
  /// this is the memory cached but not handed out at the peak (fragmentation and cache).
  std::uint64_t allocated_at_peak_reserved = 0;
  std::uint64_t segments = 0, peak_segments = 0;    ///< cudaMalloc'd segments (expandable: 1 per pool)
  std::uint64_t device_allocs = 0, device_frees = 0;///< cudaMalloc / map and cudaFree / unmap calls
  std::uint64_t retries = 0;                        ///< allocations that released the cache first
  bool oom = false;                                 ///< the trace stopped at an out-of-memory
  std::size_t oom_event = 0;                        ///< index of the failing event
  std::uint64_t oom_bytes = 0;                      ///< its requested bytes
};

[[nodiscard]] inline std::uint64_t fragmentation_at_peak(const Stats& s) {
  return s.peak_reserved - s.allocated_at_peak_reserved;
}

/// One block of a segment, in address order (for tests and explanations).
struct BlockView {
  std::uint64_t size = 0;
  bool allocated = false;
  bool mapped = true;  ///< false: an unmapped range of an expandable segment
};
struct SegmentView {
  bool small_pool = false;
  std::vector<BlockView> blocks;
};

struct Result {
  Stats stats;
  std::vector<SegmentView> segments;  ///< the segments held at the end, in address order
  /// simulate_periodic: periods extrapolated, periods simulated in full, events not simulated.
  std::size_t periods_extrapolated = 0, periods_simulated = 0, events_skipped = 0;
};

/// A loop over identical layers in a trace: `iterations` back-to-back runs of `length` events from
/// event `first`. A hint for simulate_periodic, which checks what it needs (a wrong hint costs time,
/// never a different result).
struct Period {
  std::size_t first = 0, length = 0, iterations = 0;
};

/// The size the allocator hands out for a request of `bytes` (round_size).
[[nodiscard]] std::uint64_t rounded_size(std::uint64_t bytes, const Config& c);

/// Replays the trace. Frees of unknown or already freed allocations are errors (memfit::Error).
/// An out-of-memory stops the replay (stats.oom), as the exception would stop the program.
[[nodiscard]] Result simulate(const std::vector<Event>& trace, const Config& c = {});

/// The same Result as simulate (stats and segments, bit for bit), faster on periodic traces: within
/// each period (in trace order, not overlapping), once the allocator's state at an iteration's start
/// repeats the previous start's and the remaining iterations repeat the previous one, the rest is
/// applied by copying, not simulated (the argument is in allocator.cpp). With a device limit it is
/// simulate. Frees of allocations that are not live are errors, as in simulate.
[[nodiscard]] Result simulate_periodic(const std::vector<Event>& trace, const std::vector<Period>& periods,
                                       const Config& c = {});
/// The same over a compact trace (events_from_signed's input) without 0 entries, read in place
/// (no copy of the trace as Events).
[[nodiscard]] Result simulate_periodic(const std::vector<std::int64_t>& trace, const std::vector<Period>& periods,
                                       const Config& c = {});
/// simulate_periodic's stats alone (no segment views: what the estimator reads).
[[nodiscard]] Stats periodic_stats(const std::vector<std::int64_t>& trace, const std::vector<Period>& periods,
                                   const Config& c = {});

}  // namespace memfit::alloc
