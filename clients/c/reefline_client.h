/* libreefline-client: the sensor's side of the reefline wire protocol v1 (docs/protocol.md).
 *
 * Two layers, both without DPDK:
 *
 *  - the codec: header encoding, request fragmentation, response fragment checks, bounded
 *    reassembly and result decoding. Pure functions and an assembler object, no I/O; reefgen
 *    and the tests use them on captures, the client below on its socket.
 *  - the client: a UDP socket bound to a local address, connected to one IF (address, port),
 *    that sends requests (images, tokens, tensors, raw bytes) fragmented and paced, resends
 *    unanswered ones with the same request id, and hands out reassembled, validated answers.
 *
 * Every function that can fail returns 0 (REEFLINE_OK) or a negative reefline_error and
 * leaves a message for reefline_last_error() (per thread). Nothing read from the network is
 * trusted: a hostile or broken response is counted and dropped, or delivered with its
 * decoders refusing it, never read out of bounds.
 *
 * A client is not thread-safe: use one per thread, or serialise calls. The codec functions
 * are reentrant; an assembler is used by one thread at a time. */
#ifndef REEFLINE_CLIENT_H
#define REEFLINE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define REEFLINE_API
#else
#define REEFLINE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define REEFLINE_CLIENT_VERSION_MAJOR 1
#define REEFLINE_CLIENT_VERSION_MINOR 0
#define REEFLINE_CLIENT_VERSION_PATCH 0

/* "1.0.0": the library's version, which may differ from the header the caller compiled. */
REEFLINE_API const char* reefline_client_version(void);

/* ---- protocol constants ------------------------------------------------------------- */

#define REEFLINE_PROTOCOL_VERSION 1
#define REEFLINE_MAGIC 0x52464C4Eu          /* "RFLN" */
#define REEFLINE_HEADER_SIZE 40u
#define REEFLINE_MAX_FRAGMENTS 1024u
#define REEFLINE_MAX_TOTAL_LENGTH (8u << 20) /* payload bytes of one message */
/* Largest fragment that fits a 1500-byte MTU: 1500 - 20 (IPv4) - 8 (UDP) - 40 (header). */
#define REEFLINE_MTU_FRAGMENT_SIZE 1432u
/* Largest fragment a UDP/IPv4 datagram (and a pcap frame) can carry. */
#define REEFLINE_MAX_FRAGMENT_SIZE (65535u - 14u - 20u - 8u - REEFLINE_HEADER_SIZE)

enum reefline_kind {
    REEFLINE_KIND_REQUEST = 1,
    REEFLINE_KIND_RESPONSE = 2,
    REEFLINE_KIND_ERROR = 3 /* status != ok, payload is a UTF-8 message */
};

enum reefline_format {
    REEFLINE_FORMAT_RAW = 0,
    REEFLINE_FORMAT_IMAGE_U8_HWC = 1, /* dims H, W, C */
    REEFLINE_FORMAT_TENSOR_F32 = 2,   /* dims: 1..4 extents, little-endian f32 */
    REEFLINE_FORMAT_TOKENS_I32 = 3,   /* dims N, little-endian i32 */
    REEFLINE_FORMAT_RESULT_CRC32 = 16,      /* be32 length, be32 CRC32C */
    REEFLINE_FORMAT_RESULT_TOPK = 17,       /* dims k: k x (be32 class, be32 f32 bits) */
    REEFLINE_FORMAT_RESULT_TENSOR_F32 = 18  /* dims: the output's extents, little-endian f32 */
};

enum reefline_status {
    REEFLINE_STATUS_OK = 0,
    REEFLINE_STATUS_BAD_REQUEST = 1,
    REEFLINE_STATUS_UNSUPPORTED_FORMAT = 2,
    REEFLINE_STATUS_OVERLOADED = 3,
    REEFLINE_STATUS_DEADLINE_EXCEEDED = 4,
    REEFLINE_STATUS_INTERNAL_ERROR = 5,
    REEFLINE_STATUS_SHUTTING_DOWN = 6
};

/* "ok", "bad_request", ...; "unknown" for other values. */
REEFLINE_API const char* reefline_status_name(int status);

/* ---- errors ------------------------------------------------------------------------- */

typedef enum reefline_error {
    REEFLINE_OK = 0,
    REEFLINE_E_INVALID_ARGUMENT = -1, /* a null pointer, a zero extent, an unknown format ... */
    REEFLINE_E_LIMIT = -2,            /* beyond the protocol: > 8 MiB, > 1024 fragments */
    REEFLINE_E_NO_MEMORY = -3,
    REEFLINE_E_SYSTEM = -4,           /* a socket call failed; reefline_last_error() has errno's text */
    REEFLINE_E_TIMEOUT = -5,          /* no answer in time (or after every retry) */
    REEFLINE_E_MALFORMED = -6,        /* a result whose bytes do not match its format and dims */
    REEFLINE_E_WRONG_FORMAT = -7,     /* decoding a result as what it is not (e.g. top-k of a tensor) */
    REEFLINE_E_NOT_FOUND = -8         /* not an outstanding request of this client */
} reefline_error;

/* Generic text for an error code. */
REEFLINE_API const char* reefline_strerror(int error);
/* The message of the last failure on this thread (what exactly was wrong); "" if none. */
REEFLINE_API const char* reefline_last_error(void);

/* ---- header ------------------------------------------------------------------------- */

/* The 40-byte header in host order (on the wire every field is big-endian). */
typedef struct reefline_header {
    uint8_t kind;
    uint8_t format;
    uint8_t status;
    uint64_t request_id;
    uint16_t frag_index;
    uint16_t frag_count;
    uint32_t payload_offset;
    uint32_t total_length;
    uint16_t dims[4];
} reefline_header;

/* Writes REEFLINE_HEADER_SIZE bytes (magic, version 1, reserved 0). */
REEFLINE_API void reefline_header_encode(const reefline_header* header, void* out);
/* Reads the fields of 40 bytes as they stand; checks nothing (see reefline_parse_*). */
REEFLINE_API void reefline_header_decode(const void* in, reefline_header* out);

/* Payload bytes that `dims` describe for a request format (H*W*C, 4*product, 4*N), or 0 for
 * raw and for dims that describe nothing. */
REEFLINE_API uint64_t reefline_described_length(int format, const uint16_t dims[4]);

/* Little-endian element encoding of tensor_f32 / tokens_i32 payloads (and decoding of
 * result_tensor_f32): `count` elements, 4 bytes each. */
REEFLINE_API void reefline_encode_f32(const float* values, size_t count, void* out);
REEFLINE_API void reefline_encode_i32(const int32_t* values, size_t count, void* out);
REEFLINE_API void reefline_decode_f32(const void* in, size_t count, float* out);
REEFLINE_API void reefline_decode_i32(const void* in, size_t count, int32_t* out);

/* CRC32C (Castagnoli) of a payload, as the crc32 diagnostic IF answers it. */
REEFLINE_API uint32_t reefline_crc32c(const void* data, size_t length);

/* ---- fragmentation ------------------------------------------------------------------ */

/* Fragments a `total_length`-byte payload takes at `fragment_size` bytes each (the last may be
 * shorter). REEFLINE_E_LIMIT for an empty payload, one over 8 MiB or more than 1024 fragments
 * (*count is still set, for messages); REEFLINE_E_INVALID_ARGUMENT for fragment_size 0 or
 * above REEFLINE_MAX_FRAGMENT_SIZE. */
REEFLINE_API int reefline_fragment_count(uint64_t total_length, uint32_t fragment_size,
                                         uint32_t* count);

/* The header of fragment `index` of a request (kind request, status 0, offset index *
 * fragment_size). Checks the plan as reefline_fragment_count() does, and index < count. */
REEFLINE_API int reefline_request_fragment_header(int format, const uint16_t dims[4],
                                                  uint64_t total_length, uint64_t request_id,
                                                  uint32_t fragment_size, uint32_t index,
                                                  reefline_header* out);

/* Payload bytes of a fragment planned with `fragment_size`. */
REEFLINE_API uint32_t reefline_fragment_length(const reefline_header* header,
                                               uint32_t fragment_size);

/* The UDP payload of fragment `index` of a request: header + its slice of `payload`.
 * `out` must hold REEFLINE_HEADER_SIZE + fragment_size bytes; *written gets the length. */
REEFLINE_API int reefline_encode_request_fragment(int format, const uint16_t dims[4],
                                                  const void* payload, size_t length,
                                                  uint64_t request_id, uint32_t fragment_size,
                                                  uint32_t index, void* out, size_t capacity,
                                                  size_t* written);

/* ---- parsing what arrives ----------------------------------------------------------- */

/* Verdict on one datagram (a UDP payload) read as a response or error fragment. */
typedef enum reefline_fragment_verdict {
    REEFLINE_FRAGMENT_OK = 0,                   /* a response or error fragment to file */
    REEFLINE_FRAGMENT_REQUEST = 1,              /* a request fragment: not a response, ignore */
    REEFLINE_FRAGMENT_SHORT = 2,                /* shorter than the header ("short_payload") */
    REEFLINE_FRAGMENT_BAD_HEADER = 3,           /* magic, version or reserved wrong */
    REEFLINE_FRAGMENT_BAD_KIND = 4,             /* neither response nor error */
    REEFLINE_FRAGMENT_TOO_MANY_FRAGMENTS = 5,   /* count 0 or > 1024, or index >= count */
    REEFLINE_FRAGMENT_TOO_LARGE = 6,            /* total_length > 8 MiB */
    REEFLINE_FRAGMENT_OFFSET_OUT_OF_RANGE = 7   /* offset + fragment length > total_length */
} reefline_fragment_verdict;

/* "ok", "request", "short_payload", "bad_header", "bad_kind", "too_many_fragments",
 * "too_large", "offset_out_of_range". */
REEFLINE_API const char* reefline_fragment_verdict_name(int verdict);

/* Checks a response/error datagram. On REEFLINE_FRAGMENT_OK, *header has its fields and
 * *fragment / *fragment_length point into `datagram`. Never reads beyond `length`. */
REEFLINE_API reefline_fragment_verdict reefline_parse_response(const void* datagram, size_t length,
                                                               reefline_header* header,
                                                               const uint8_t** fragment,
                                                               size_t* fragment_length);

/* The same verdict for a header already copied out of a frame (the 40 raw bytes) and the
 * number of payload bytes after it (never REEFLINE_FRAGMENT_SHORT or _REQUEST). */
REEFLINE_API reefline_fragment_verdict reefline_check_response_header(const void* header40,
                                                                      size_t fragment_length);

/* Checks a request datagram as reefline's data plane does (responders in tests, tools):
 * 0 when acceptable, else the drop reason's number (1 bad_header, 2 zero_length, 3 too_large,
 * 4 too_many_fragments, 5 offset_out_of_range, 6 dims_mismatch, 7 shorter than the header). */
REEFLINE_API int reefline_parse_request(const void* datagram, size_t length, reefline_header* header,
                                        const uint8_t** fragment, size_t* fragment_length);

/* ---- reassembly --------------------------------------------------------------------- */

/* Who a message belongs to: the peer's address and port (host order; 0 when there is only
 * one peer, as on a client's connected socket) and the request id. */
typedef struct reefline_flow {
    uint32_t ip;
    uint16_t port;
    uint64_t request_id;
} reefline_flow;

typedef struct reefline_assembler_options {
    /* Bounds on incomplete messages; beyond them the oldest are dropped. 0: unbounded. */
    size_t max_pending;        /* incomplete messages */
    /* Bytes of memory the assembler allocates, all of it, as malloc spends it: per incomplete
     * message its entry (about 130 bytes), an array of 8 bytes per piece and each piece (its
     * bytes plus 20 to 35); the hash table; the memory of completed flows; and the last
     * completed message until the next add or forget. Nothing is sized by what a header
     * claims (frag_count, total_length), only by what arrived. A message must be able to
     * hold its pieces and its reassembled copy at once (about twice its bytes, plus the
     * overheads): one that alone cannot is dropped (REEFLINE_ADD_TOO_LARGE); otherwise the
     * oldest other incomplete messages make room. Live memory (beyond the assembler object
     * itself) never exceeds it. 0: unbounded, for finite trusted inputs only. */
    size_t max_pending_bytes;
    /* Keep the keys of the most recent completed messages, so that late duplicates are
     * reported as such (REEFLINE_ADD_AFTER_COMPLETION) instead of opening a new message.
     * 0: off. 1 (or negative): as many as room allows: a quarter of max_pending_bytes
     * (about 28 bytes a key), or 65536 keys when max_pending_bytes is 0. n > 1: at most n
     * keys, still within that quarter. The memory grows with use; past its capacity (or
     * when growing it would exceed max_pending_bytes) the oldest key is forgotten, and a
     * late duplicate of that message then opens a new incomplete message like any fragment
     * (which the bounds drop in time, or which completes and is delivered again). */
    int remember_completed;
} reefline_assembler_options;

typedef enum reefline_add_outcome {
    REEFLINE_ADD_ACCEPTED = 0,          /* filed, message still incomplete */
    REEFLINE_ADD_COMPLETED = 1,         /* this fragment completed the message */
    REEFLINE_ADD_DUPLICATE = 2,         /* index already present: ignored (the first copy wins) */
    REEFLINE_ADD_INCONSISTENT = 3,      /* disagrees with the message's first fragment, or with
                                           the protocol's limits: ignored */
    REEFLINE_ADD_AFTER_COMPLETION = 4,  /* key already completed (remember_completed only) */
    REEFLINE_ADD_TOO_LARGE = 5          /* the message alone (its pieces and its reassembled
                                           copy) would exceed max_pending_bytes: dropped whole */
} reefline_add_outcome;

/* "accepted", "completed", "duplicate", "inconsistent", "after_completion", "too_large". */
REEFLINE_API const char* reefline_add_outcome_name(int outcome);

/* A completed message: fragments concatenated in offset order. `payload` belongs to the
 * assembler and stays valid until the next add, forget or destroy; payload[length] is 0. */
typedef struct reefline_message {
    reefline_flow flow;
    reefline_header head;  /* fields of the first fragment seen */
    const uint8_t* payload;
    size_t length;
    int tiles;             /* offsets tile [0, total_length) exactly: no gap, no overlap */
} reefline_message;

typedef struct reefline_pending {
    reefline_flow flow;
    reefline_header head;
    uint32_t received;  /* distinct fragment indices present */
} reefline_pending;

typedef struct reefline_assembler reefline_assembler;

/* options may be NULL (unbounded, no memory of completed keys). NULL on allocation failure. */
REEFLINE_API reefline_assembler* reefline_assembler_create(const reefline_assembler_options* options);
REEFLINE_API void reefline_assembler_destroy(reefline_assembler* assembler);

/* Files one fragment whose header and bytes are given (already parsed: any kind). On
 * REEFLINE_ADD_COMPLETED, *completed describes the message. Returns a reefline_add_outcome
 * (>= 0), or REEFLINE_E_INVALID_ARGUMENT / REEFLINE_E_NO_MEMORY. */
REEFLINE_API int reefline_assembler_add(reefline_assembler* assembler, const reefline_flow* flow,
                                        const reefline_header* header, const void* fragment,
                                        size_t length, reefline_message* completed);

/* Drops the incomplete message of `flow`, if any; returns 1 if there was one. */
REEFLINE_API int reefline_assembler_forget(reefline_assembler* assembler, const reefline_flow* flow);

/* Incomplete messages, oldest first: writes at most `capacity` to `out` (which may be NULL
 * when capacity is 0) and returns how many there are. */
REEFLINE_API size_t reefline_assembler_pending(const reefline_assembler* assembler,
                                               reefline_pending* out, size_t capacity);
/* Bytes the assembler holds now, as max_pending_bytes counts them (not only fragment bytes:
 * see reefline_assembler_options); 0 when it holds nothing. */
REEFLINE_API size_t reefline_assembler_pending_bytes(const reefline_assembler* assembler);
/* Incomplete messages dropped by the bounds so far (too_large ones included). */
REEFLINE_API uint64_t reefline_assembler_evicted(const reefline_assembler* assembler);
/* 1 if `flow` completed before and is still remembered (remember_completed only). */
REEFLINE_API int reefline_assembler_is_completed(const reefline_assembler* assembler,
                                                 const reefline_flow* flow);

/* ---- results ------------------------------------------------------------------------ */

/* An answer: a reassembled response (kind response, status ok) or error (kind error).
 * Results from the client own their payload (release with reefline_result_clear; a zeroed
 * result is empty), and payload[payload_length] is 0, so an error's message is a C string.
 * A result may also be a view that the caller fills (payload pointing to its own bytes,
 * `owner` NULL) to use the decoders below. */
typedef struct reefline_result {
    uint64_t request_id;
    uint8_t kind;    /* REEFLINE_KIND_RESPONSE or REEFLINE_KIND_ERROR */
    uint8_t status;  /* reefline_status */
    uint8_t format;  /* reefline_format of the payload */
    uint16_t dims[4];
    const uint8_t* payload;
    size_t payload_length;
    uint32_t attempts;  /* times the client sent the request (1 + resends) */
    double latency_us;  /* first send to the answer's last fragment */
    void* owner;        /* the library's; NULL for views */
} reefline_result;

REEFLINE_API void reefline_result_clear(reefline_result* result);

/* Checks that the payload is what kind, status, format and dims say: result_crc32 8 bytes,
 * result_topk 8k bytes with dims {k, 0, 0, 0}, result_tensor_f32 4 * product(dims) bytes
 * with 1..4 leading non-zero extents then zeros, an error with a non-zero status.
 * REEFLINE_OK, or REEFLINE_E_MALFORMED with the reason in reefline_last_error(). A result of
 * another format (raw) passes. */
REEFLINE_API int reefline_result_validate(const reefline_result* result);

typedef struct reefline_topk_entry {
    uint32_t class_index;
    float score;
} reefline_topk_entry;

/* `count` whole 8-byte (be32 class, be32 f32 bits) entries as they stand, no checks: for
 * tools that show whatever arrived. Applications use reefline_result_topk. */
REEFLINE_API void reefline_decode_topk(const void* in, size_t count, reefline_topk_entry* out);

/* Decoded views. Each returns REEFLINE_E_WRONG_FORMAT when the result is not of that format
 * (or is an error), REEFLINE_E_MALFORMED when its bytes do not match its header. Arrays:
 * at most `capacity` entries are written, and *count gets how many there are (pass
 * capacity 0 to ask). */
REEFLINE_API int reefline_result_topk(const reefline_result* result, reefline_topk_entry* out,
                                      size_t capacity, size_t* count);
/* dims: the tensor's extents (up to 4; *ndims of them), either may be NULL. */
REEFLINE_API int reefline_result_tensor(const reefline_result* result, float* out, size_t capacity,
                                        size_t* count, uint32_t dims[4], size_t* ndims);
/* The extents of a result_tensor_f32 header: its leading non-zero dims (1..4), or
 * REEFLINE_E_MALFORMED when they are not 1..4 non-zero extents followed only by zeros.
 * Checks the dims alone, not the payload length. */
REEFLINE_API int reefline_result_tensor_dims(const reefline_result* result, uint32_t dims[4],
                                             size_t* ndims);
/* The crc32 IF's answer: the payload length and CRC32C it computed. */
REEFLINE_API int reefline_result_crc32(const reefline_result* result, uint32_t* length,
                                       uint32_t* crc);
/* An error's message, copied with a terminating NUL (truncated to capacity - 1 bytes);
 * returns the message's length, or a negative error (REEFLINE_E_WRONG_FORMAT when the
 * result is not an error). */
REEFLINE_API int reefline_result_error_message(const reefline_result* result, char* out,
                                               size_t capacity);

/* ---- the client --------------------------------------------------------------------- */

typedef struct reefline_client_options {
    const char* bind_address;  /* local IPv4 address; NULL or "0.0.0.0": any */
    uint16_t bind_port;        /* 0: ephemeral */
    const char* address;       /* the appliance's IPv4 address (required) */
    uint16_t port;             /* the IF's UDP port (required) */
    uint32_t fragment_size;    /* payload bytes per fragment; default REEFLINE_MTU_FRAGMENT_SIZE */
    /* Pacing of every datagram sent (resends included); 0: as fast as the socket takes them.
     * Consecutive datagrams leave at least 1/pace_packets_per_s and size/pace_bytes_per_s
     * apart (the larger; size is the UDP payload: header + fragment), so the rates are upper
     * bounds that no burst exceeds. Sending blocks for it (the last 0.1 ms spinning). */
    double pace_bytes_per_s;
    double pace_packets_per_s;
    /* A request not answered within retry_timeout_ms is sent again (same id, every fragment)
     * up to `retries` times; then the client gives up on it. retry_timeout_ms 0: never give
     * up (an unanswered request stays outstanding until max_outstanding pushes it out). */
    uint32_t retries;          /* default 0 */
    uint32_t retry_timeout_ms; /* default 1000 */
    /* What reefline_client_receive / _wait / _request wait for when passed
     * REEFLINE_TIMEOUT_DEFAULT; negative: forever. Default 1000. */
    int32_t receive_timeout_ms;
    uint64_t first_request_id;  /* 0: a fresh base from the clock, so restarts do not reuse ids */
    /* Bounds on what the client keeps, whatever arrives: requests awaiting an answer (the
     * oldest is abandoned beyond it), and bytes of memory that reassembling responses takes
     * (reefline_assembler_options: pieces, their bookkeeping and the reassembled copy, about
     * twice an answer's bytes). Defaults 4096, 64 MiB. */
    size_t max_outstanding;
    size_t max_pending_bytes;
    int socket_buffer_bytes;    /* SO_RCVBUF/SO_SNDBUF; default 4 MiB; 0: leave the kernel's */
} reefline_client_options;

/* Special timeout_ms values for reefline_client_receive / _wait / _request. */
#define REEFLINE_TIMEOUT_DEFAULT (-1) /* the option receive_timeout_ms */
#define REEFLINE_TIMEOUT_FOREVER (-2) /* any other negative value waits forever too */

/* Fills the defaults (address and port stay unset). */
REEFLINE_API void reefline_client_options_init(reefline_client_options* options);

typedef struct reefline_client reefline_client;

/* Opens and binds the socket and connects it to the IF (the kernel then drops datagrams from
 * anyone else). *client is NULL on failure. */
REEFLINE_API int reefline_client_create(const reefline_client_options* options,
                                        reefline_client** client);
REEFLINE_API void reefline_client_destroy(reefline_client* client);

/* The socket, for poll/epoll: readable when reefline_client_receive has something to read.
 * Do not read from it or close it. */
REEFLINE_API int reefline_client_fd(const reefline_client* client);
/* The local address and port the socket is bound to (host order); either may be NULL. */
REEFLINE_API int reefline_client_local_address(const reefline_client* client, uint32_t* ip,
                                               uint16_t* port);

/* Sending. Each call fragments, encodes and sends one request (blocking for pacing) and
 * returns its request id in *request_id (may be NULL). The request then awaits its answer:
 * collect it with reefline_client_receive or reefline_client_wait. */
REEFLINE_API int reefline_client_send_image(reefline_client* client, uint16_t height, uint16_t width,
                                            uint16_t channels, const uint8_t* pixels,
                                            uint64_t* request_id);
/* tokens: host-order ints, written little-endian. */
REEFLINE_API int reefline_client_send_tokens(reefline_client* client, const int32_t* tokens,
                                             size_t count, uint64_t* request_id);
/* dims: 1..4 extents (each 1..65535); values: product(dims) floats, written little-endian. */
REEFLINE_API int reefline_client_send_tensor(reefline_client* client, const uint16_t* dims,
                                             size_t ndims, const float* values,
                                             uint64_t* request_id);
REEFLINE_API int reefline_client_send_raw(reefline_client* client, const void* bytes, size_t length,
                                          uint64_t* request_id);
/* Any request format with an already encoded payload; dims must describe `length`. */
REEFLINE_API int reefline_client_send(reefline_client* client, int format, const uint16_t dims[4],
                                      const void* payload, size_t length, uint64_t* request_id);

/* The next answer to any outstanding request, in arrival order; resends due requests while it
 * waits. REEFLINE_E_TIMEOUT when none arrived in timeout_ms (0: only what is already there;
 * REEFLINE_TIMEOUT_DEFAULT: the option's). *result is overwritten: clear it when done. */
REEFLINE_API int reefline_client_receive(reefline_client* client, int timeout_ms,
                                         reefline_result* result);

/* The answer to one request; answers to others that arrive meanwhile are kept for
 * reefline_client_receive. REEFLINE_E_TIMEOUT when timeout_ms passes (the request stays
 * outstanding) or the client gave up on it after its retries; REEFLINE_E_NOT_FOUND when it
 * is not outstanding (never sent, already received, given up or abandoned). */
REEFLINE_API int reefline_client_wait(reefline_client* client, uint64_t request_id, int timeout_ms,
                                      reefline_result* result);

/* Send and wait: one request in, its answer out (an error answer is a result too: check
 * result->kind / status). On timeout the request is abandoned, so a late answer is dropped. */
REEFLINE_API int reefline_client_request(reefline_client* client, int format, const uint16_t dims[4],
                                         const void* payload, size_t length, int timeout_ms,
                                         reefline_result* result);

/* Stops waiting for a request: it will not be resent and its answer will be dropped.
 * Returns 1 if it was outstanding. */
REEFLINE_API int reefline_client_abandon(reefline_client* client, uint64_t request_id);
/* Requests awaiting an answer. */
REEFLINE_API size_t reefline_client_outstanding(const reefline_client* client);

typedef struct reefline_client_stats {
    uint64_t requests_sent;   /* distinct requests */
    uint64_t resends;         /* requests sent again by the retry policy */
    uint64_t datagrams_sent;
    uint64_t bytes_sent;      /* UDP payload bytes */
    uint64_t answers;         /* answers delivered or waiting to be (responses and errors) */
    uint64_t errors;          /* of which error answers (kind 3) */
    uint64_t gave_up;         /* requests given up after their retries */
    uint64_t abandoned;       /* requests pushed out by max_outstanding or abandoned */
    uint64_t duplicates;      /* answers to requests already answered or no longer awaited */
    uint64_t rejected;        /* datagrams that failed the fragment checks or were truncated */
    uint64_t inconsistent;    /* fragments that disagreed with their message's first */
    uint64_t evicted;         /* partial responses dropped by the bounds (max_pending_bytes) */
} reefline_client_stats;

REEFLINE_API void reefline_client_get_stats(const reefline_client* client,
                                            reefline_client_stats* stats);

#ifdef __cplusplus
}
#endif

#endif /* REEFLINE_CLIENT_H */
