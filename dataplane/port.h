// An ethdev with its mbuf pools: configured with one or more rx queues (RSS on the UDP
// 4-tuple, so every fragment of a request reaches the same queue) and one tx queue.
#pragma once

#include <rte_ethdev.h>
#include <rte_mempool.h>

#include <cstdint>
#include <string>
#include <vector>

namespace reefline::dp {

struct port_config {
    uint16_t port_id = 0;
    uint16_t rx_queues = 1;
    uint16_t rx_descriptors = 1024;
    uint16_t tx_descriptors = 1024;
    uint32_t rx_mbufs = 16383;  // 2^n - 1 is the mempool's best size
    uint32_t tx_mbufs = 4095;
    uint16_t mtu = 0;           // 0: leave the device's default
    bool promiscuous = true;
};

// A range of pinned memory that holds mbufs, for the GPU backend to register
// (cudaHostRegister) so kernels read packet payloads in place. Page aligned.
struct memory_range {
    void* address;
    size_t length;
    uint64_t iova;
    size_t page_size;
};

// The memory behind a mempool's objects, rounded out to whole pages and merged.
std::vector<memory_range> mempool_memory_ranges(const rte_mempool* pool);

class port {
public:
    explicit port(const port_config& config);
    ~port();  // stops and closes the device (net_pcap flushes its tx file here)
    port(const port&) = delete;
    port& operator=(const port&) = delete;

    uint16_t id() const { return _config.port_id; }
    uint16_t rx_queues() const { return _config.rx_queues; }
    rte_mempool* rx_pool() const { return _rx_pool; }
    rte_mempool* tx_pool() const { return _tx_pool; }
    const std::string& driver() const { return _driver; }
    bool rx_ip_checksum() const { return _rx_cksum; }
    // Largest response fragment payload that fits the MTU and a tx mbuf.
    uint32_t max_fragment_payload() const { return _max_fragment_payload; }
    std::vector<memory_range> memory_ranges() const { return mempool_memory_ranges(_rx_pool); }
    rte_eth_stats stats() const;
    void stop();
    // Stops and closes the device, which gives back the mbufs its queues held; the pools
    // stay, so the caller can check that every mbuf came home.
    void close();

private:
    port_config _config;
    rte_mempool* _rx_pool = nullptr;
    rte_mempool* _tx_pool = nullptr;
    std::string _driver;
    bool _rx_cksum = false;
    bool _started = false;
    bool _closed = false;
    uint32_t _max_fragment_payload = 0;
};

}  // namespace reefline::dp
