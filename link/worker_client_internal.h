/*
 * worker_client_internal.h — the worker client's test entry (worker_client.h is the contract).
 */
#ifndef LNK_WORKER_CLIENT_INTERNAL_H
#define LNK_WORKER_CLIENT_INTERNAL_H

#include "worker_client.h"

/* lnk_worker_client_connect as if p->address (a valid HOST:PORT, used for logs and reasons)
 * were a host name that resolved to addrs[0..n_addrs) (1..16, copied): the very connect path
 * of a resolved name (each address in order, the timeout shared out, the reasons), without the
 * system's resolver, so tests can give a name several addresses. Returns like
 * lnk_worker_client_connect. */
int lnk__worker_client_connect_addrs(uv_loop_t *loop, const lnk_worker_client_params_t *p,
                                     const struct sockaddr_storage *addrs, size_t n_addrs,
                                     const lnk_worker_client_cbs_t *cbs, void *ud,
                                     lnk_worker_client_t **out, char *err, size_t err_len);

#endif
