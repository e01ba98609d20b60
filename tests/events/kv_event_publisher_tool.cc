// A KvEventPublisher driven line by line from stdin, for tests/tools/kv_events_zmq_test.py (a real
// pyzmq subscriber). Not a test itself.
//
//   kv_event_publisher_tool ENDPOINT REPLAY_ENDPOINT TOPIC MAX_QUEUE_BATCHES SEND_HWM
// prints {"endpoint": ..., "replay_endpoint": ...} once the sockets are up, then per command:
//   publish COUNT SEED BLOCKS BLOCK_SIZE  COUNT batches of one BlockStored (BLOCKS blocks) and one
//                                          BlockRemoved, from SEED; prints one JSON line per batch,
//                                          the events as vLLM's decoder sees them (lists, tag
//                                          first)
//   probe                                  one batch [AllBlocksCleared]; prints it
//   flush                                  waits (10 s at most); prints the stats
// and exits at the end of stdin. Each JSON line is one batch, in Publish order (= seq order).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include "kvtier/kv_events.h"

namespace {

using kvtier::KvEvent;

std::string Json(const std::optional<std::string>& s) {
  return s ? fmt::format("\"{}\"", *s) : "null";
}

std::string Json(const KvEvent& event) {
  if (const auto* s = std::get_if<kvtier::BlockStored>(&event)) {
    return fmt::format("[\"BlockStored\", [{}], {}, [{}], {}, {}, {}, null]",
                       fmt::join(s->block_hashes, ", "),
                       s->parent_block_hash ? std::to_string(*s->parent_block_hash) : "null",
                       fmt::join(s->token_ids, ", "), s->block_size,
                       s->lora_id ? std::to_string(*s->lora_id) : "null", Json(s->medium));
  }
  if (const auto* r = std::get_if<kvtier::BlockRemoved>(&event)) {
    return fmt::format("[\"BlockRemoved\", [{}], {}]", fmt::join(r->block_hashes, ", "),
                       Json(r->medium));
  }
  return "[\"AllBlocksCleared\"]";
}

std::string Json(const std::vector<KvEvent>& events) {
  std::vector<std::string> parts;
  for (const KvEvent& e : events) parts.push_back(Json(e));
  return fmt::format("{{\"events\": [{}]}}", fmt::join(parts, ", "));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s ENDPOINT REPLAY_ENDPOINT TOPIC MAX_QUEUE_BATCHES SEND_HWM\n",
                 argv[0]);
    return 2;
  }
  kvtier::KvEventPublisherConfig config;
  config.endpoint = argv[1];
  config.replay_endpoint = argv[2];
  config.topic = argv[3];
  config.max_queue_batches = std::stoll(argv[4]);
  config.send_hwm = std::stoll(argv[5]);
  config.replay_buffer_batches = 1000000;
  auto pub = kvtier::KvEventPublisher::Open(config);
  if (!pub.ok()) {
    std::fprintf(stderr, "%s\n", pub.status().ToString().c_str());
    return 1;
  }
  std::cout << fmt::format("{{\"endpoint\": \"{}\", \"replay_endpoint\": \"{}\"}}\n",
                           (*pub)->endpoint(), (*pub)->replay_endpoint())
            << std::flush;
  std::chrono::nanoseconds max_publish{0};
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "publish") {
      int count = 0, blocks = 0, block_size = 0;
      uint64_t seed = 0;
      in >> count >> seed >> blocks >> block_size;
      std::mt19937_64 rng(seed);
      std::string out;
      for (int i = 0; i < count; ++i) {
        kvtier::BlockStored stored;
        stored.block_size = block_size;
        for (int b = 0; b < blocks; ++b) stored.block_hashes.push_back(rng());
        if (rng() % 2) stored.parent_block_hash = rng();
        for (int t = 0; t < blocks * block_size; ++t) {
          stored.token_ids.push_back(static_cast<kvtier::Token>(rng() % 200000));
        }
        stored.medium = std::string(rng() % 2 ? kvtier::kMediumGpu : kvtier::kMediumDisk);
        kvtier::BlockRemoved removed{{rng(), rng()}, std::string(kvtier::kMediumCpuPinned)};
        std::vector<KvEvent> events = {std::move(stored), std::move(removed)};
        out += Json(events);
        out += '\n';
        const auto start = std::chrono::steady_clock::now();
        (*pub)->Publish(std::move(events));
        max_publish = std::max(max_publish, std::chrono::steady_clock::now() - start);
      }
      std::cout << out << std::flush;
    } else if (command == "probe") {
      std::vector<KvEvent> events = {kvtier::AllBlocksCleared{}};
      std::cout << Json(events) << '\n' << std::flush;
      (*pub)->Publish(std::move(events));
    } else if (command == "flush") {
      const bool flushed = (*pub)->Flush(std::chrono::seconds(10));
      const kvtier::KvEventPublisherStats s = (*pub)->stats();
      std::cout << fmt::format(
                       "{{\"flushed\": {}, \"published_batches\": {}, \"dropped_batches\": {}, "
                       "\"dropped_events\": {}, \"replay_requests\": {}, \"send_errors\": {}, "
                       "\"max_publish_us\": {}}}\n",
                       flushed, s.published_batches, s.dropped_batches, s.dropped_events,
                       s.replay_requests, s.send_errors,
                       std::chrono::duration_cast<std::chrono::microseconds>(max_publish).count())
                << std::flush;
    } else if (!command.empty()) {
      std::fprintf(stderr, "unknown command '%s'\n", command.c_str());
      return 2;
    }
  }
  return 0;
}
