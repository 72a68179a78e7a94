/* http.c - see http.h. Each connection has its own thread (libmicrohttpd's thread-per-connection mode), so a handler
 * may block: a completion request waits for its decoding in its own thread, watching its socket for the client
 * leaving, and a stream's content reader blocks until the worker has queued the next event. */
#include "http.h"
#include "completion.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

extern const unsigned char dllm_canvas_html[];  /* examples/server/canvas.html, embedded by examples/server/build.sh */
extern const size_t dllm_canvas_html_len;

/* A body is read at most this far past the limit before the connection is dropped (a client that goes on sending
 * gets no answer); below it, the whole body is drained so that the client can read its 413. */
#define DISCARD_LIMIT (16u << 20)
#define WAIT_SLICE_MS 100       /* how often a waiting handler looks at its socket */
#define STREAM_BLOCK_SIZE (64u << 10)

typedef struct connection_state {
    char *body;
    size_t len, cap;
    size_t received;            /* every body byte seen, kept or not */
    int too_large;
} connection_state;

typedef struct stream_state {
    server *srv;
    completion *c;
    struct MHD_Connection *connection;
} stream_state;

/* ---- responses ----------------------------------------------------------------------------------------------- */

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *content_type, const void *data, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ok;
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result respond_json(struct MHD_Connection *conn, unsigned status, const char *json) {
    return respond(conn, status, "application/json", json, strlen(json));
}

static enum MHD_Result respond_cjson(struct MHD_Connection *conn, unsigned status, cJSON *root) {
    char *json = root ? cJSON_PrintUnformatted(root) : NULL;
    enum MHD_Result ok = json ? respond_json(conn, status, json) : MHD_NO;
    free(json);
    cJSON_Delete(root);
    return ok;
}

static enum MHD_Result respond_error(struct MHD_Connection *conn, const api_error *err) {
    char *json = api_error_json(err);
    enum MHD_Result ok = json ? respond_json(conn, (unsigned)err->http_status, json) : MHD_NO;
    free(json);
    return ok;
}

#if defined(__GNUC__)
__attribute__((format(printf, 6, 7)))
#endif
static enum MHD_Result respond_new_error(struct MHD_Connection *conn, unsigned status, const char *type, const char *param, const char *code,
                                         const char *fmt, ...) {
    api_error err;
    va_list ap;
    err.http_status = (int)status;
    err.type = type;
    err.param = param;
    err.code = code;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof err.message, fmt, ap);
    va_end(ap);
    return respond_error(conn, &err);
}

/* ---- the client's socket ------------------------------------------------------------------------------------- */

/* The peer closed its side (or the socket failed): nobody will read the answer. */
static int client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct pollfd p;
    if (!info) return 0;
    p.fd = info->connect_fd;
    p.events = POLLRDHUP;
    p.revents = 0;
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Constant time, so that the key cannot be guessed a byte at a time from response times. */
static int same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), i;
    unsigned diff = (unsigned)(la ^ lb);
    for (i = 0; i < la; i++) diff |= (unsigned char)a[i] ^ (unsigned char)(lb ? b[i % lb] : 0);
    return diff == 0;
}

static int authorized(const server *srv, struct MHD_Connection *conn) {
    const char *auth;
    if (!srv->cfg.api_key) return 1;
    auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return auth && !strncmp(auth, "Bearer ", 7) && same_secret(auth + 7, srv->cfg.api_key);
}

/* ---- streaming ----------------------------------------------------------------------------------------------- */

/* libmicrohttpd asks for the next bytes of a stream: block until the worker queued some (or the end), watching the
 * client; a client that left cancels its sequences. */
static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_state *s = (stream_state *)cls;
    (void)pos;
    for (;;) {
        long n = completion_read_stream(s->c, buf, max);
        if (n > 0) return (ssize_t)n;
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!completion_wait(s->c, WAIT_SLICE_MS) && client_gone(s->connection)) {
            completion_cancel(s->c);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

/* The stream's response is done with (written, or the client gone): a stream that did not end cancels. */
static void free_stream(void *cls) {
    stream_state *s = (stream_state *)cls;
    completion_cancel(s->c);  /* harmless when finished; stops the decoding when the client left mid-stream */
    completion_release(s->c);
    atomic_fetch_sub(&s->srv->active_streams, 1);
    free(s);
}

static enum MHD_Result start_stream(server *srv, struct MHD_Connection *conn, completion *c) {
    stream_state *s = (stream_state *)calloc(1, sizeof *s);
    struct MHD_Response *r;
    enum MHD_Result ok;
    if (!s) {
        completion_cancel(c);
        completion_release(c);
        atomic_fetch_sub(&srv->active_streams, 1);
        return MHD_NO;
    }
    s->srv = srv;
    s->c = c;
    s->connection = conn;
    if (!(r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK_SIZE, read_stream, s, free_stream))) {
        free_stream(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");  /* a reverse proxy must not hold the events back */
    ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);  /* libmicrohttpd keeps it (and calls free_stream) for as long as it needs it */
    return ok;
}

/* ---- endpoints ----------------------------------------------------------------------------------------------- */

static enum MHD_Result handle_completion(server *srv, struct MHD_Connection *conn, int chat, const connection_state *st) {
    api_request req;
    api_error err;
    completion *c;
    char *json = NULL;
    int streaming;
    enum MHD_Result ok;
    if (atomic_load(&srv->stopping)) return respond_new_error(conn, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
    if (api_parse_request(srv, chat, st->body ? st->body : "", st->len, &req, &err)) return respond_error(conn, &err);
    streaming = req.stream;
    if (streaming && atomic_fetch_add(&srv->active_streams, 1) >= srv->cfg.max_streams) {
        atomic_fetch_sub(&srv->active_streams, 1);
        api_request_free(&req);
        return respond_new_error(conn, 429, "rate_limit_error", "stream", "too_many_streams", "too many concurrent streams (at most %d): retry later",
                                 srv->cfg.max_streams);
    }
    if (!(c = completion_create(srv, &req))) {
        if (streaming) atomic_fetch_sub(&srv->active_streams, 1);
        return respond_new_error(conn, 503, "server_error", NULL, "out_of_memory", "out of memory");
    }
    if (completion_submit(c, &err)) {
        completion_release(c);
        if (streaming) atomic_fetch_sub(&srv->active_streams, 1);
        return respond_error(conn, &err);
    }
    /* Wait for the answer (a stream: its first event), so that a request failing before it decodes still gets its
     * HTTP error status. */
    while (!completion_wait(c, WAIT_SLICE_MS)) {
        if (client_gone(conn)) {
            completion_cancel(c);
            completion_release(c);
            if (streaming) atomic_fetch_sub(&srv->active_streams, 1);
            return MHD_NO;  /* closes the connection: nobody is listening */
        }
    }
    if (completion_result(c, &json, &err)) {
        completion_release(c);
        if (streaming) atomic_fetch_sub(&srv->active_streams, 1);
        return respond_error(conn, &err);
    }
    if (!json) return start_stream(srv, conn, c);  /* the stream owns c and the stream count from here */
    completion_release(c);
    if (streaming) atomic_fetch_sub(&srv->active_streams, 1);
    ok = respond_json(conn, MHD_HTTP_OK, json);
    free(json);
    return ok;
}

static cJSON *model_object(const server *srv) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->started);
    cJSON_AddStringToObject(m, "owned_by", "dllm");
    cJSON_AddNumberToObject(m, "max_model_len", srv->info.max_seq_len);
    return m;
}

static enum MHD_Result handle_models(server *srv, struct MHD_Connection *conn) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), model_object(srv));
    return respond_cjson(conn, MHD_HTTP_OK, root);
}

static enum MHD_Result handle_health(server *srv, struct MHD_Connection *conn) {
    cJSON *root = cJSON_CreateObject();
    int waiting = 0, running = 0, stopping = atomic_load(&srv->stopping);
    sched_counts(srv->sched, &waiting, &running);
    cJSON_AddStringToObject(root, "status", stopping ? "stopping" : "ok");
    cJSON_AddStringToObject(root, "model", srv->model_id);
    cJSON_AddStringToObject(root, "backend", srv->backend_used == DLLM_BACKEND_GPU ? "gpu" : "cpu");
    cJSON_AddNumberToObject(root, "waiting", waiting);
    cJSON_AddNumberToObject(root, "running", running);
    cJSON_AddNumberToObject(root, "streams", atomic_load(&srv->active_streams));
    return respond_cjson(conn, stopping ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK, root);
}

/* Which endpoint a path is, and the method it takes. */
typedef enum { ROUTE_NONE, ROUTE_CANVAS, ROUTE_HEALTH, ROUTE_MODELS, ROUTE_MODEL, ROUTE_CHAT, ROUTE_COMPLETIONS } route;

static route find_route(const char *url, const char **method_needed) {
    *method_needed = MHD_HTTP_METHOD_GET;
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) return ROUTE_CANVAS;
    if (!strcmp(url, "/health")) return ROUTE_HEALTH;
    if (!strcmp(url, "/v1/models")) return ROUTE_MODELS;
    if (!strncmp(url, "/v1/models/", 11)) return ROUTE_MODEL;
    *method_needed = MHD_HTTP_METHOD_POST;
    if (!strcmp(url, "/v1/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/v1/completions")) return ROUTE_COMPLETIONS;
    return ROUTE_NONE;
}

static enum MHD_Result dispatch(server *srv, struct MHD_Connection *conn, const char *url, const char *method, const connection_state *st) {
    const char *method_needed;
    route r = find_route(url, &method_needed);
    if (r == ROUTE_NONE) return respond_new_error(conn, 404, "invalid_request_error", NULL, "not_found", "no endpoint %.200s", url);
    if (strcmp(method, method_needed) && !(r <= ROUTE_MODEL && !strcmp(method, MHD_HTTP_METHOD_HEAD)))
        return respond_new_error(conn, 405, "invalid_request_error", NULL, "method_not_allowed", "%.200s takes %s, not %.16s", url, method_needed, method);
    if (st->too_large)
        return respond_new_error(conn, 413, "invalid_request_error", NULL, "request_too_large", "the request body is over the server's limit of %zu bytes",
                                 srv->cfg.max_body);
    if (r == ROUTE_CANVAS) return respond(conn, MHD_HTTP_OK, "text/html; charset=utf-8", dllm_canvas_html, dllm_canvas_html_len);
    if (r == ROUTE_HEALTH) return handle_health(srv, conn);
    if (!authorized(srv, conn))
        return respond_new_error(conn, 401, "invalid_request_error", NULL, "invalid_api_key",
                                 "Incorrect API key provided: pass it as \"Authorization: Bearer KEY\"");
    if (r == ROUTE_MODELS) return handle_models(srv, conn);
    if (r == ROUTE_MODEL) {
        if (strcmp(url + 11, srv->model_id))
            return respond_new_error(conn, 404, "invalid_request_error", "model", "model_not_found", "The model '%.128s' does not exist", url + 11);
        return respond_cjson(conn, MHD_HTTP_OK, model_object(srv));
    }
    return handle_completion(srv, conn, r == ROUTE_CHAT, st);
}

/* libmicrohttpd's access handler: called once with the headers, then with each piece of the body, then once more
 * (upload_data_size 0) to answer. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size, void **con_cls) {
    server *srv = (server *)cls;
    connection_state *st = (connection_state *)*con_cls;
    (void)version;
    if (!st) {
        if (!(st = (connection_state *)calloc(1, sizeof *st))) return MHD_NO;
        *con_cls = st;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        st->received += n;
        if (st->received > srv->cfg.max_body) st->too_large = 1;
        if (st->received > (size_t)srv->cfg.max_body + DISCARD_LIMIT) return MHD_NO;
        if (!st->too_large) {
            if (st->len + n + 1 > st->cap) {
                size_t cap = (st->len + n + 1) * 2;
                char *grown = (char *)realloc(st->body, cap < srv->cfg.max_body + 1 ? cap : srv->cfg.max_body + 1);
                if (!grown) return MHD_NO;
                st->body = grown;
                st->cap = cap < srv->cfg.max_body + 1 ? cap : srv->cfg.max_body + 1;
            }
            memcpy(st->body + st->len, upload_data, n);
            st->len += n;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    return dispatch(srv, conn, url, method, st);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode why) {
    connection_state *st = (connection_state *)*con_cls;
    (void)cls, (void)conn, (void)why;
    if (st) {
        free(st->body);
        free(st);
        *con_cls = NULL;
    }
}

/* libmicrohttpd's own messages (a client that left mid-stream, a malformed request line) are routine for a
 * server: shown with --verbose only. */
static void log_mhd(void *cls, const char *fmt, va_list ap) {
    const server *srv = (const server *)cls;
    if (!srv->cfg.verbose) return;
    fprintf(stderr, "dllm-server: http: ");
    vfprintf(stderr, fmt, ap);
}

struct MHD_Daemon *http_start(server *srv, int *bound_port) {
    struct addrinfo hints, *addr = NULL;
    char port[16];
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *info;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    int rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(port, sizeof port, "%d", srv->cfg.port);
    if ((rc = getaddrinfo(srv->cfg.host, port, &hints, &addr)) != 0) {
        fprintf(stderr, "dllm-server: --host %s: %s\n", srv->cfg.host, gai_strerror(rc));
        return NULL;
    }
    if (addr->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    d = MHD_start_daemon(flags, (uint16_t)srv->cfg.port, NULL, NULL, on_request, srv,
                         MHD_OPTION_SOCK_ADDR, addr->ai_addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                         MHD_OPTION_EXTERNAL_LOGGER, log_mhd, srv,
                         /* every connection is a thread: bounded by the streams and the queue, plus room for /health */
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)(srv->cfg.max_streams + srv->cfg.max_queue + 32),
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                         MHD_OPTION_END);
    freeaddrinfo(addr);
    if (!d) {
        fprintf(stderr, "dllm-server: cannot listen on %s:%d (in use, or not an address of this machine?)\n", srv->cfg.host, srv->cfg.port);
        return NULL;
    }
    info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = info ? (int)info->port : srv->cfg.port;
    return d;
}

void http_stop(struct MHD_Daemon *daemon) {
    if (daemon) MHD_stop_daemon(daemon);
}
