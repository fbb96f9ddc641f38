// The option structs the README, the quickstart and the header comments fill with designated
// initializers, each with only some of its members named, as the docs do. Built with -Wall
// -Wextra -Werror (see parts.cmake): a member without a default member initializer would warn
// (missing-field-initializers) and fail the consumer build.
#include <kvtier/kvtier.hpp>
#include <kvtier/resp/connection.hpp>
#include <kvtier/resp/pool.hpp>
#include <kvtier/resp/url.hpp>
#include <kvtier/store/cluster_store.hpp>

#include <chrono>
#include <string>

std::string use_doc_initializers() {
  using namespace std::chrono_literals;
  const kvtier::key_namespace ns{.model = "m", .chunk_tokens = 256};
  const kvtier::fetch_queue_options q{.workers = 2};
  const kvtier::fetch_queue_options q2{.max_batch_chunks = 1, .metrics = nullptr};
  const kvtier::tiered_options t{.metrics = nullptr};
  const kvtier::pinned_arena::options a{.slot_bytes = 4096, .slots = 4};
  const kvtier::layer_range layers{.first = 0};
  const kvtier::media_item image{.offset = 40, .length = 576};
  const kvtier::key_material extra{.tenant_salt = "salt"};
  const kvtier::load_path path{.fixed_cost_s = 1e-3};
  const kvtier::prefill_node node{.kv_bytes_per_token = 48.4e3};
  const kvtier::broadcast_params p{.n_chunks = 1, .chunk_tokens = 256, .chunk_bytes = 64, .request_id = 1};
  const kvtier::phase_deadlines dl{.collective = kvtier::deadline_after(1s)};
  const kvtier::resp::connection_options c{.server = kvtier::resp::endpoint{.host = "127.0.0.1"}};
  const kvtier::resp::pool_options pool{.connections = 4};
  const kvtier::resp::password_source pw{.file = "/run/secrets/valkey"};
  const kvtier::resp::password_source pw_env{.env = "MY_VALKEY_PASSWORD"};
  const kvtier::fetch_queue_options q3{.fault_injector = {}};
  const kvtier::resp::tls_options tls{.ca_file = "ca.pem"};
  const kvtier::cluster_options cl{.seeds = {}};
  return ns.model +
         std::to_string(q.workers + q2.max_batch_chunks + a.slots + layers.first + image.length + p.n_chunks +
                        pool.connections + extra.tenant_salt.size() + c.server.host.size() + pw.file.size() +
                        (pw_env.env != nullptr) + q3.workers + tls.ca_file.size() + cl.seeds.size() +
                        (t.metrics == nullptr) + (dl.local_io == kvtier::no_deadline)) +
         std::to_string(path.fixed_cost_s + node.kv_bytes_per_token);
}
