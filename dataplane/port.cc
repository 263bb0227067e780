#include "dataplane/port.h"

#include <rte_errno.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <rte_memory.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "clients/c/wire/protocol.h"

namespace reefline::dp {

namespace {

[[noreturn]] void fail(const std::string& what, int err) {
    throw std::runtime_error("port: " + what + ": " + rte_strerror(err < 0 ? -err : err));
}

}  // namespace

std::vector<memory_range> mempool_memory_ranges(const rte_mempool* pool) {
    std::vector<memory_range> ranges;
    rte_mempool_mem_iter(
        const_cast<rte_mempool*>(pool),
        [](rte_mempool*, void* opaque, rte_mempool_memhdr* hdr, unsigned) {
            auto& out = *static_cast<std::vector<memory_range>*>(opaque);
            const rte_memseg_list* msl = rte_mem_virt2memseg_list(hdr->addr);
            const size_t page = msl ? msl->page_sz : size_t(sysconf(_SC_PAGESIZE));
            const auto start = reinterpret_cast<uintptr_t>(hdr->addr) & ~(page - 1);
            const auto end =
                (reinterpret_cast<uintptr_t>(hdr->addr) + hdr->len + page - 1) & ~(page - 1);
            const uint64_t iova = hdr->iova == RTE_BAD_IOVA
                                      ? RTE_BAD_IOVA
                                      : hdr->iova - (reinterpret_cast<uintptr_t>(hdr->addr) - start);
            out.push_back({reinterpret_cast<void*>(start), end - start, iova, page});
        },
        &ranges);
    std::sort(ranges.begin(), ranges.end(),
              [](const memory_range& a, const memory_range& b) { return a.address < b.address; });
    std::vector<memory_range> merged;
    for (const auto& r : ranges) {
        if (!merged.empty()) {
            auto& last = merged.back();
            const auto last_end = static_cast<uint8_t*>(last.address) + last.length;
            if (static_cast<uint8_t*>(r.address) <= last_end) {
                const auto end = std::max(last_end, static_cast<uint8_t*>(r.address) + r.length);
                last.length = size_t(end - static_cast<uint8_t*>(last.address));
                continue;
            }
        }
        merged.push_back(r);
    }
    return merged;
}

port::port(const port_config& config) : _config(config) {
    const uint16_t pid = config.port_id;
    if (!rte_eth_dev_is_valid_port(pid))
        throw std::runtime_error("port: no ethdev " + std::to_string(pid) +
                                 " (give one with --vdev or a PCI device to EAL)");
    rte_eth_dev_info info{};
    if (int rc = rte_eth_dev_info_get(pid, &info); rc != 0) fail("dev_info_get", rc);
    _driver = info.driver_name ? info.driver_name : "?";
    if (config.rx_queues > info.max_rx_queues)
        throw std::runtime_error("port: " + _driver + " has at most " +
                                 std::to_string(info.max_rx_queues) + " rx queues");
    const int socket = std::max(0, rte_eth_dev_socket_id(pid));

    // Room for a standard frame (or the configured MTU) in one segment, so every fragment's
    // payload is contiguous in one mbuf.
    const uint32_t frame_room = std::max<uint32_t>(config.mtu ? config.mtu + 18 + 4 : 1518 + 4,
                                                   RTE_MBUF_DEFAULT_DATAROOM);
    const auto data_room = uint16_t(frame_room + RTE_PKTMBUF_HEADROOM);
    const std::string rx_name = "rx_pool_" + std::to_string(pid);
    _rx_pool = rte_pktmbuf_pool_create(rx_name.c_str(), config.rx_mbufs, 256, 0, data_room, socket);
    if (!_rx_pool) fail("mbuf pool " + rx_name, rte_errno);
    const std::string tx_name = "tx_pool_" + std::to_string(pid);
    _tx_pool = rte_pktmbuf_pool_create(tx_name.c_str(), config.tx_mbufs, 256, 0, data_room, socket);
    if (!_tx_pool) fail("mbuf pool " + tx_name, rte_errno);

    rte_eth_conf conf{};
    if (config.rx_queues > 1) {
        conf.rx_adv_conf.rss_conf.rss_hf =
            (RTE_ETH_RSS_NONFRAG_IPV4_UDP | RTE_ETH_RSS_IPV4) & info.flow_type_rss_offloads;
        if (conf.rx_adv_conf.rss_conf.rss_hf) {
            conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
        } else {
            // Virtual ports spread by their own rule: net_af_packet's kernel fanout hashes on
            // the flow (so a request's fragments still meet on one queue); net_pcap and
            // net_ring queues carry whatever their inputs carry.
            RTE_LOG(WARNING, USER1, "port %u (%s): no RSS; rx queues follow the driver's own distribution\n",
                    pid, _driver.c_str());
        }
    }
    if ((info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_IPV4_CKSUM) &&
        (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_UDP_CKSUM)) {
        conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
        _rx_cksum = true;
    }
    if (int rc = rte_eth_dev_configure(pid, config.rx_queues, 1, &conf); rc != 0)
        fail("configure " + _driver, rc);
    if (config.mtu) {
        if (int rc = rte_eth_dev_set_mtu(pid, config.mtu); rc != 0) fail("set_mtu", rc);
    }
    uint16_t rxd = config.rx_descriptors, txd = config.tx_descriptors;
    rte_eth_dev_adjust_nb_rx_tx_desc(pid, &rxd, &txd);
    for (uint16_t q = 0; q < config.rx_queues; ++q) {
        rte_eth_rxconf rxq = info.default_rxconf;
        rxq.offloads = conf.rxmode.offloads;
        if (int rc = rte_eth_rx_queue_setup(pid, q, rxd, socket, &rxq, _rx_pool); rc != 0)
            fail("rx_queue_setup", rc);
    }
    if (int rc = rte_eth_tx_queue_setup(pid, 0, txd, socket, &info.default_txconf); rc != 0)
        fail("tx_queue_setup", rc);
    if (int rc = rte_eth_dev_start(pid); rc != 0) fail("start " + _driver, rc);
    _started = true;
    if (config.promiscuous) rte_eth_promiscuous_enable(pid);  // not every vdev supports it

    uint16_t mtu = 1500;
    rte_eth_dev_get_mtu(pid, &mtu);
    const uint32_t tx_room = data_room - RTE_PKTMBUF_HEADROOM - 18 - 4;
    _max_fragment_payload = std::min<uint32_t>(mtu, tx_room) - 20 - 8 - wire::header_size;
}

port::~port() {
    close();
    rte_mempool_free(_tx_pool);
    rte_mempool_free(_rx_pool);
}

void port::stop() {
    if (_started) {
        rte_eth_dev_stop(_config.port_id);
        _started = false;
    }
}

void port::close() {
    stop();
    if (!_closed) {
        rte_eth_dev_close(_config.port_id);
        _closed = true;
    }
}

rte_eth_stats port::stats() const {
    rte_eth_stats s{};
    rte_eth_stats_get(_config.port_id, &s);
    return s;
}

}  // namespace reefline::dp
