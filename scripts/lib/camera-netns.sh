# Sourced by scripts/demo and tests/{live,e2e}_test.sh: a "camera" network namespace joined to
# the host by a veth pair, for reefline on net_af_packet on the host side. Addresses from
# 198.18.0.0/15 (RFC 2544 benchmarking): the camera is 198.18.0.1/24, reefline answers ARP
# for 198.18.0.2 (its --ip). Nothing is routed beyond the pair.
#
# camera_netns_up NS HOST_IF CAM_IF: creates the namespace and the pair; returns non-zero (and
# creates nothing) when namespaces cannot be made here. camera_netns_down NS HOST_IF removes
# both; safe to call whatever state they are in.
camera_netns_up() {
  local ns=$1 host_if=$2 cam_if=$3
  ip netns add "$ns" 2>/dev/null || return 1
  ip link add "$host_if" type veth peer name "$cam_if"
  ip link set "$cam_if" netns "$ns"
  ip link set "$host_if" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add 198.18.0.1/24 dev "$cam_if"
  ip netns exec "$ns" ip link set "$cam_if" up
  # Kernel sockets send from cam_if: without this their UDP checksums leave partial (the veth
  # peer would complete them, net_af_packet does not).
  ip netns exec "$ns" ethtool -K "$cam_if" tx off >/dev/null 2>&1 || true
  ethtool -K "$host_if" tx off >/dev/null 2>&1 || true
}

camera_netns_down() {
  ip netns del "$1" 2>/dev/null || true
  ip link del "$2" 2>/dev/null || true
}
