/* http.h - dllm-server's HTTP side on libmicrohttpd: routing, API key, body limits, OpenAI error objects, and the
 * waiting and streaming of completions. */
#ifndef DLLM_SERVER_HTTP_H
#define DLLM_SERVER_HTTP_H

#include "server.h"

struct MHD_Daemon;

/* Starts listening on srv->cfg.host:port (thread per connection); NULL after printing why. *bound_port receives
 * the port (the one the OS picked for --port 0). */
struct MHD_Daemon *http_start(server *srv, int *bound_port);

/* Closes the listening socket and every connection, waiting for their threads. */
void http_stop(struct MHD_Daemon *daemon);

#endif
