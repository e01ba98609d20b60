// Batches of single-key commands to a Redis server or cluster (see redis_client.h).
#include "storage/redis/redis_client.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <thread>

#include "storage/redis/crc16.h"
#include "storage/redis/redis_cluster.h"

namespace kvtier::storage {
namespace {

using Clock = std::chrono::steady_clock;

// Rounds of a batch: the first send, then resends after MOVED / ASK / TRYAGAIN.
constexpr int kMaxRounds = 5;
// A refresh asked for by a redirect or a failure waits at least this long after the last one.
constexpr auto kMinRefreshInterval = std::chrono::milliseconds(100);
// TRYAGAIN (a slot in the middle of a migration): wait this long before resending.
constexpr auto kTryAgainPause = std::chrono::milliseconds(5);

Deadline EarlierOf(Deadline a, Deadline b) { return a < b ? a : b; }

bool IsError(const redisReply* reply, std::string_view prefix) {
  return reply->type == REDIS_REPLY_ERROR &&
         std::string_view(reply->str, reply->len).starts_with(prefix);
}

}  // namespace

// The connections to one server: an idle pool, and the backoff after failures.
class RedisNode {
 public:
  RedisNode(RedisEndpoint endpoint, const RedisAuth& auth, const RedisClientConfig& config)
      : endpoint_(std::move(endpoint)), auth_(auth), config_(config) {}

  const RedisEndpoint& endpoint() const { return endpoint_; }

  // An idle healthy connection, or a new one (bounded by the connect timeout and `deadline`).
  // Unavailable at once while the node is backing off after a failure.
  Result<std::unique_ptr<RedisConnection>> Acquire(Deadline deadline) {
    const auto now = Clock::now();
    {
      std::lock_guard lock(mu_);
      while (!idle_.empty()) {
        std::unique_ptr<RedisConnection> connection = std::move(idle_.back());
        idle_.pop_back();
        if (connection->IdleAndHealthy()) return connection;
      }
      if (now < retry_at_) {
        return Status::Unavailable(fmt::format(
            "redis {}: down ({}); next connect in {} ms", endpoint_.ToString(), last_error_,
            std::chrono::ceil<std::chrono::milliseconds>(retry_at_ - now).count()));
      }
    }
    Result<std::unique_ptr<RedisConnection>> connection = RedisConnection::Connect(
        endpoint_, auth_, EarlierOf(deadline, now + config_.url.connect_timeout));
    std::lock_guard lock(mu_);
    ++connects_;
    if (!connection.ok()) {
      ++connect_failures_;
      BackOffLocked(connection.status().message());
      return connection.status();
    }
    failures_ = 0;
    return connection;
  }

  // Returns a connection after a batch: kept when it is clean, dropped otherwise.
  void Release(std::unique_ptr<RedisConnection> connection) {
    if (connection->broken() || connection->pending_replies() != 0) return;
    std::lock_guard lock(mu_);
    if (static_cast<int>(idle_.size()) < config_.max_idle_connections_per_node) {
      idle_.push_back(std::move(connection));
    }
  }

  // A connection to this node failed or timed out: its idle peers are suspect too.
  void ReportFailure(std::string_view why) {
    std::lock_guard lock(mu_);
    ++node_failures_;
    idle_.clear();
    BackOffLocked(why);
  }

  // False after a failure, until a connect succeeds again.
  bool healthy() const {
    std::lock_guard lock(mu_);
    return failures_ == 0;
  }

  void AddCounters(RedisClientCounters& counters) const {
    std::lock_guard lock(mu_);
    counters.connects += connects_;
    counters.connect_failures += connect_failures_;
    counters.node_failures += node_failures_;
  }

 private:
  void BackOffLocked(std::string_view why) {
    ++failures_;
    const int shift = std::min(failures_ - 1, 20);
    const auto backoff = std::min<std::chrono::milliseconds>(config_.backoff_min * (1LL << shift),
                                                             config_.backoff_max);
    retry_at_ = Clock::now() + backoff;
    last_error_ = std::string(why);
  }

  const RedisEndpoint endpoint_;
  const RedisAuth& auth_;
  const RedisClientConfig& config_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;
  int failures_ = 0;  // consecutive, since the last successful connect
  Clock::time_point retry_at_{};
  std::string last_error_;
  int64_t connects_ = 0, connect_failures_ = 0, node_failures_ = 0;
};

RedisClient::RedisClient(RedisClientConfig config)
    : config_(std::move(config)), auth_{config_.url.user, config_.url.password} {}

RedisClient::~RedisClient() = default;

RedisNode* RedisClient::node(int index) const {
  std::lock_guard lock(mu_);
  return nodes_[static_cast<size_t>(index)].get();
}

int RedisClient::NodeIndexLocked(const RedisEndpoint& endpoint) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->endpoint() == endpoint) return static_cast<int>(i);
  }
  nodes_.push_back(std::make_unique<RedisNode>(endpoint, auth_, config_));
  return static_cast<int>(nodes_.size() - 1);
}

Result<std::unique_ptr<RedisClient>> RedisClient::Open(RedisClientConfig config,
                                                       Deadline deadline) {
  std::unique_ptr<RedisClient> client(new RedisClient(std::move(config)));
  const std::string url = client->config_.url.Redacted();
  {
    std::lock_guard lock(client->mu_);
    for (const RedisEndpoint& seed : client->config_.url.endpoints) client->NodeIndexLocked(seed);
  }
  if (client->config_.url.cluster) {
    client->slot_node_.assign(kRedisClusterSlots, -1);
    if (Status s = client->RefreshSlots(deadline, /*force=*/true); !s.ok()) {
      return Status::Unavailable(fmt::format("{}: {}", url, s.message()));
    }
    return client;
  }
  // One server: connect (and AUTH), then PING, which also says when a password is required.
  RedisNode* server = client->node(0);
  Result<std::unique_ptr<RedisConnection>> connection = server->Acquire(deadline);
  if (!connection.ok()) return Status::Unavailable(connection.status().message());
  (*connection)->Append({"PING"});
  std::vector<RedisReplyPtr> replies;
  RedisConnection* connections[] = {connection->get()};
  std::vector<RedisReplyPtr>* reply_lists[] = {&replies};
  PipelineOutcome outcome[1];
  RunPipelines(connections, reply_lists,
               EarlierOf(deadline, Clock::now() + client->config_.command_timeout), outcome);
  if (!outcome[0].status.ok()) {
    return Status::Unavailable(
        fmt::format("{}: no answer to PING: {}", url, outcome[0].status.message()));
  }
  const redisReply* reply = replies.front().get();
  if (reply->type == REDIS_REPLY_ERROR) {
    return Status::Unavailable(fmt::format(
        "{}: the server refuses commands{}: {}", url,
        client->config_.url.password.empty() ? " (no password given)" : "", DescribeReply(reply)));
  }
  server->Release(std::move(connection).value());
  return client;
}

Status RedisClient::RefreshSlots(Deadline deadline, bool force) {
  std::vector<int> candidates;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    if (!force && (!refresh_wanted_.load() || now - last_refresh_ < kMinRefreshInterval)) {
      return Status::OK();
    }
    last_refresh_ = now;
    refresh_wanted_ = false;
    // Nodes that serve slots first, then the seeds and every other node known.
    for (int index : slot_node_) {
      if (index >= 0 &&
          std::find(candidates.begin(), candidates.end(), index) == candidates.end()) {
        candidates.push_back(index);
      }
    }
    for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
      if (std::find(candidates.begin(), candidates.end(), i) == candidates.end()) {
        candidates.push_back(i);
      }
    }
    // Nodes that failed last go last: a refresh should not spend the batch's time on them.
    std::stable_partition(candidates.begin(), candidates.end(),
                          [&](int i) { return nodes_[static_cast<size_t>(i)]->healthy(); });
  }
  std::string errors;
  for (int index : candidates) {
    if (Clock::now() >= deadline) {
      errors += errors.empty() ? "" : "; ";
      errors += "timed out";
      break;
    }
    RedisNode* candidate = node(index);
    Result<std::unique_ptr<RedisConnection>> connection = candidate->Acquire(deadline);
    if (!connection.ok()) {
      errors += errors.empty() ? "" : "; ";
      errors += connection.status().message();
      continue;
    }
    (*connection)->Append({"CLUSTER", "SLOTS"});
    std::vector<RedisReplyPtr> replies;
    RedisConnection* connections[] = {connection->get()};
    std::vector<RedisReplyPtr>* reply_lists[] = {&replies};
    PipelineOutcome outcome[1];
    RunPipelines(connections, reply_lists,
                 EarlierOf(deadline, Clock::now() + config_.command_timeout), outcome);
    if (!outcome[0].status.ok()) {
      candidate->ReportFailure(outcome[0].status.message());
      errors += errors.empty() ? "" : "; ";
      errors += fmt::format("redis {}: {}", candidate->endpoint().ToString(),
                            outcome[0].status.message());
      continue;
    }
    candidate->Release(std::move(connection).value());
    Result<std::vector<RedisSlotRange>> ranges =
        ParseClusterSlots(*replies.front(), candidate->endpoint());
    if (!ranges.ok() || ranges->empty()) {
      errors += errors.empty() ? "" : "; ";
      errors += ranges.ok() ? fmt::format("redis {}: serves no slots (cluster not set up?)",
                                          candidate->endpoint().ToString())
                            : ranges.status().message();
      continue;
    }
    std::lock_guard lock(mu_);
    std::vector<int> fresh(kRedisClusterSlots, -1);
    for (const RedisSlotRange& range : *ranges) {
      const int owner = NodeIndexLocked(range.master);
      std::fill(fresh.begin() + range.first, fresh.begin() + range.last + 1, owner);
    }
    slot_node_ = std::move(fresh);
    slot_refreshes_.fetch_add(1);
    return Status::OK();
  }
  refresh_wanted_ = true;
  return Status::Unavailable(fmt::format("cannot read the cluster's slot map: {}", errors));
}

void RedisClient::Execute(std::span<RedisOp> ops, Deadline deadline) {
  const bool cluster = config_.url.cluster;
  struct Group {
    int node = -1;
    std::vector<size_t> ops;   // indexes into `ops`, in send order
    std::vector<bool> asking;  // per op: preceded by ASKING
    std::unique_ptr<RedisConnection> connection;
    std::vector<RedisReplyPtr> replies;
  };
  for (int round = 0; round < kMaxRounds; ++round) {
    if (cluster && round == 0) (void)RefreshSlots(deadline, /*force=*/false);
    std::vector<Group> groups;
    bool any_pending = false;
    {
      std::lock_guard lock(mu_);
      for (size_t i = 0; i < ops.size(); ++i) {
        RedisOp& op = ops[i];
        if (op.outcome != RedisOpOutcome::kPending) continue;
        int target = 0;
        bool asking = false;
        if (op.ask_node >= 0) {
          target = op.ask_node;
          asking = true;
          op.ask_node = -1;
        } else if (cluster) {
          const int slot = HashSlot(op.key);
          target = slot_node_[static_cast<size_t>(slot)];
          if (target < 0) {
            op.outcome = RedisOpOutcome::kFailed;
            op.error = fmt::format("slot {} is served by no node", slot);
            refresh_wanted_ = true;
            continue;
          }
        }
        any_pending = true;
        auto group = std::find_if(groups.begin(), groups.end(),
                                  [&](const Group& g) { return g.node == target; });
        if (group == groups.end()) {
          groups.push_back(Group{});
          group = groups.end() - 1;
          group->node = target;
        }
        group->ops.push_back(i);
        group->asking.push_back(asking);
      }
    }
    if (!any_pending) return;
    if (Clock::now() >= deadline) break;

    // Connect (or take pooled connections) and queue each group's commands.
    std::vector<RedisConnection*> connections;
    std::vector<std::vector<RedisReplyPtr>*> reply_lists;
    std::vector<Group*> sent;
    for (Group& group : groups) {
      RedisNode* target = node(group.node);
      Result<std::unique_ptr<RedisConnection>> connection = target->Acquire(deadline);
      if (!connection.ok()) {
        for (size_t i : group.ops) {
          ops[i].outcome = RedisOpOutcome::kFailed;
          ops[i].error = connection.status().message();
        }
        if (cluster) refresh_wanted_ = true;
        continue;
      }
      group.connection = std::move(connection).value();
      for (size_t k = 0; k < group.ops.size(); ++k) {
        const RedisOp& op = ops[group.ops[k]];
        if (group.asking[k]) group.connection->Append({"ASKING"});
        if (op.verb == "SET") {
          group.connection->AppendWithValue({op.verb, op.key}, op.value);
        } else if (op.verb == "SETRANGE") {
          group.connection->AppendWithValue({op.verb, op.key, op.offset}, op.value);
        } else {
          group.connection->Append({op.verb, op.key}, op.sink);
        }
      }
      connections.push_back(group.connection.get());
      reply_lists.push_back(&group.replies);
      sent.push_back(&group);
    }
    std::vector<PipelineOutcome> outcomes(sent.size());
    RunPipelines(connections, reply_lists,
                 EarlierOf(deadline, Clock::now() + config_.command_timeout), outcomes);
    round_trips_.fetch_add(static_cast<int64_t>(sent.size()));

    // Hand out the replies; note redirects for the next round.
    bool try_again = false;
    for (size_t g = 0; g < sent.size(); ++g) {
      Group& group = *sent[g];
      RedisNode* target = node(group.node);
      size_t next_reply = 0;
      for (size_t k = 0; k < group.ops.size(); ++k) {
        RedisOp& op = ops[group.ops[k]];
        if (group.asking[k]) ++next_reply;  // ASKING's +OK (an error shows in the next reply)
        if (next_reply >= group.replies.size()) {
          op.outcome = outcomes[g].timed_out ? RedisOpOutcome::kTimedOut : RedisOpOutcome::kFailed;
          op.error = fmt::format("redis {}: {}", target->endpoint().ToString(),
                                 outcomes[g].status.message());
          continue;
        }
        RedisReplyPtr reply = std::move(group.replies[next_reply++]);
        if (reply == nullptr) {  // a value read straight into the op's sink
          op.sunk = true;
          op.outcome = RedisOpOutcome::kReplied;
          continue;
        }
        if (reply->type == REDIS_REPLY_ERROR) {
          const std::string_view text(reply->str, reply->len);
          if (std::optional<RedisRedirect> redirect = ParseRedirect(text, target->endpoint());
              redirect && cluster) {
            std::lock_guard lock(mu_);
            const int new_node = NodeIndexLocked(redirect->target);
            if (redirect->ask) {
              op.ask_node = new_node;
              ask_.fetch_add(1);
            } else {
              slot_node_[static_cast<size_t>(redirect->slot)] = new_node;
              refresh_wanted_ = true;
              moved_.fetch_add(1);
            }
            continue;  // stays pending
          }
          if (cluster && IsError(reply.get(), "TRYAGAIN")) {
            try_again = true;
            continue;
          }
        }
        op.reply = std::move(reply);
        op.outcome = RedisOpOutcome::kReplied;
      }
      if (!outcomes[g].status.ok()) {
        target->ReportFailure(outcomes[g].status.message());
        if (cluster) refresh_wanted_ = true;
      } else {
        target->Release(std::move(group.connection));
      }
    }
    if (try_again)
      std::this_thread::sleep_until(EarlierOf(deadline, Clock::now() + kTryAgainPause));
  }
  for (RedisOp& op : ops) {
    if (op.outcome != RedisOpOutcome::kPending) continue;
    const bool late = Clock::now() >= deadline;
    op.outcome = late ? RedisOpOutcome::kTimedOut : RedisOpOutcome::kFailed;
    op.error = late ? "timed out" : fmt::format("still redirected after {} rounds", kMaxRounds);
  }
}

std::string RedisClient::SlotOwner(int slot) const {
  std::lock_guard lock(mu_);
  if (!config_.url.cluster) return nodes_.front()->endpoint().ToString();
  if (slot < 0 || slot >= kRedisClusterSlots) return "";
  const int index = slot_node_[static_cast<size_t>(slot)];
  return index < 0 ? "" : nodes_[static_cast<size_t>(index)]->endpoint().ToString();
}

RedisClientCounters RedisClient::counters() const {
  RedisClientCounters counters;
  counters.moved = moved_.load();
  counters.ask = ask_.load();
  counters.slot_refreshes = slot_refreshes_.load();
  counters.round_trips = round_trips_.load();
  std::lock_guard lock(mu_);
  for (const auto& n : nodes_) n->AddCounters(counters);
  return counters;
}

}  // namespace kvtier::storage
