/* pslab's worker side for other languages: a C API over the parameter-server client
 * (src/ps/client.h), built as libpslab_client.so. A worker written in Python (worker/python/pslab,
 * ctypes) or anything that calls C speaks to a run's servers exactly as pslab_worker does: the
 * same wire, codecs, error feedback, heartbeats, reconnects, backups and checks; no protocol of
 * its own.
 *
 * θ and ∇θ are host arrays of all P floats (pslab_client_num_params), shard k the contiguous
 * range its server announces. A call returns 0, or -1 with pslab_client_error() saying why
 * (naming the server, its address and what was waited for, as the C++ workers' errors do).
 *
 * Threading: one thread calls a client at a time (its heartbeat thread is its own affair).
 */
#ifndef PSLAB_CLIENT_H
#define PSLAB_CLIENT_H

#ifdef __cplusplus
extern "C" {
#endif

#define PSLAB_CLIENT_API __attribute__((visibility("default"))) /* the library exports these alone */

typedef struct pslab_client pslab_client;

/* What a round of replies said, over all shards (ps/client.h: PullResult). */
typedef struct {
  long min_version, max_version; /* of the shards' θ that came back */
  long samples_applied;          /* min over shards */
  long held_us;                  /* longest a server held the request (the consistency rule's wait) */
  long min_clock;                /* the slowest worker's clock */
  int training_done;             /* every server: every worker said Bye */
} pslab_pull_info;

/* The rank that opens the run's evaluator: it takes θ when due and reports the user's evaluation. */
#define PSLAB_CLIENT_EVALUATOR (-1)

/* A worker of the run that `config_path` (the run's config.toml) describes, with `overrides`
 * ("section.key=value", n_overrides of them, as `--set`), as worker `rank`, to the servers at
 * `servers` (comma-separated, in shard order; NULL or "": none, a client for the config, the share and
 * the data alone, which talks to no server), their backups at `backups` (cluster.replicas = 2;
 * NULL or "" without), authenticating with the run's key file `auth_key` (NULL or "" without).
 * Never NULL: on failure the client says why (pslab_client_error) and every other call fails. */
PSLAB_CLIENT_API pslab_client* pslab_client_open(const char* config_path, const char* const* overrides, int n_overrides,
                                                 int rank, const char* servers, const char* backups, const char* auth_key);
/* rank PSLAB_CLIENT_EVALUATOR: the run's evaluator (pslab_client_next_theta, _eval, _shutdown). */
/* From now on, SIGINT (where the process has a handler of its own: Python's) ends the blocking
 * waits of calls made on this thread: the call fails with "interrupted by SIGINT" (the handler
 * still runs: Python raises KeyboardInterrupt once the call returns). Other threads' waits and
 * the default dispositions are left as they are. */
PSLAB_CLIENT_API void pslab_client_catch_interrupts(void);
/* Why the last call failed, or "" after one that succeeded. Valid until the next call. */
PSLAB_CLIENT_API const char* pslab_client_error(const pslab_client* c);
/* P, the number of floats of θ and of every gradient (0 for a client that failed to open). */
PSLAB_CLIENT_API long pslab_client_num_params(const pslab_client* c);
/* This worker's share of the run, as pslab_worker takes it: the steps it trains (train.steps, or
 * train.epochs x the steps of an epoch), the steps of an epoch, and the sample indices (into the
 * training set of data.*, 0-based) of its batch at `step` (0-based over the run) written to idx
 * (room for `room`; idx NULL: the count alone): returns their count (train.batch; fewer, even 0, at
 * an epoch's end), or -1.
 * Workers of one run draw disjoint shards of one permutation per epoch, from the run's seed. */
PSLAB_CLIENT_API long pslab_client_total_steps(const pslab_client* c);
PSLAB_CLIENT_API long pslab_client_steps_per_epoch(const pslab_client* c);
PSLAB_CLIENT_API int pslab_client_batch(pslab_client* c, long step, unsigned* idx, int room);
/* The run's training set as pslab_worker reads it (data.*: Fashion-MNIST, the synthetic sets; not
 * data.kind = "external"), loaded on first use: its samples, the floats of one sample, the number
 * of classes (0: regression); pslab_client_train_set copies the samples (n x features, row-major)
 * into x and their labels (n; classification) into labels. */
PSLAB_CLIENT_API long pslab_client_train_samples(pslab_client* c);
PSLAB_CLIENT_API int pslab_client_features(pslab_client* c);
PSLAB_CLIENT_API int pslab_client_classes(pslab_client* c);
PSLAB_CLIENT_API int pslab_client_train_set(pslab_client* c, float* x, int* labels);
/* The same of the test set (data.test_samples of it, normalised as the training set). */
PSLAB_CLIENT_API long pslab_client_test_samples(pslab_client* c);
PSLAB_CLIENT_API int pslab_client_test_set(pslab_client* c, float* x, int* labels);
/* Regression (classes 0): the floats of one sample's targets, and the targets of the training
 * (test = 0) or test set (test = 1), n x that many, into targets. */
PSLAB_CLIENT_API int pslab_client_target_dim(pslab_client* c);
PSLAB_CLIENT_API int pslab_client_targets(pslab_client* c, int test, float* targets);
/* Metrics as pslab_worker writes them, to run_dir/metrics/worker<rank>.jsonl (the evaluator's:
 * evaluator.jsonl): a "train" line per
 * train.log_every steps with the same fields (so that the launcher's summary, comparison and
 * plots read them), times since run_start (Unix seconds, as the launcher's --run-start; <= 0:
 * now); rank 0 prints progress lines on stderr. Then pslab_client_step after every step: its loss,
 * samples, seconds computing, communicating (push and pull), and of those held by the servers
 * (the rule's wait), and the θ version it computed on (pslab_pull_info's min_version; -1: none). */
PSLAB_CLIENT_API int pslab_client_metrics(pslab_client* c, const char* run_dir, double run_start);
PSLAB_CLIENT_API int pslab_client_step(pslab_client* c, long step, double loss, int samples, double compute_s,
                                       double comm_s, double wait_s, long version);
/* The run's config, resolved (the file, the overrides, every default), as JSON text:
 * {"model": {"kind": ...}, "cluster": {"mode": ...}, ...}. Valid while the client lives. */
PSLAB_CLIENT_API const char* pslab_client_config(const pslab_client* c);

/* ---- Training by the run's rule: what pslab_worker does around its model's gradient ----
 * begin, then train_step after each step's gradient, then end. The rule is the servers' mode's:
 * bsp, ssp, asp, dcasgd push the gradient (the mean of train.accumulate batches) and θ for the
 * next step comes back; local:H and easgd step the worker's own optimizer (optimizer.*, at the
 * schedule's learning rate, pslab's own code) on θ and exchange the model every H (sync_every)
 * steps. Straggler injection (straggler.*) sleeps as in pslab_worker; with pslab_client_metrics
 * each step is logged as pslab_worker logs it. */
typedef struct {
  pslab_pull_info pull; /* the servers' last answer */
  int exchanged;        /* this step talked to the servers */
  double comm_s;        /* seconds it did */
  double wait_s;        /* of those, held by the servers (the rule's wait) */
  double delay_s;       /* seconds slept by straggler injection */
  double lr;            /* local:H, easgd: the worker's own optimizer's learning rate; else -1 */
} pslab_step_info;
/* Hello to every server (the start barrier), then θ for step 0 into theta (P floats). */
PSLAB_CLIENT_API int pslab_client_begin(pslab_client* c, float* theta, pslab_step_info* info);
/* Step `step` (0, 1, ... < total_steps) computed `grad` (P floats: the mean gradient over `samples`
 * samples, with loss `loss`, in compute_s seconds) on theta; afterwards theta holds θ for the next
 * step (unchanged after the last one). info may be NULL. */
PSLAB_CLIENT_API int pslab_client_train_step(pslab_client* c, long step, double loss, int samples, double compute_s,
                                             const float* grad, float* theta, pslab_step_info* info);
/* After the last step: Bye to every server, metrics flushed. */
PSLAB_CLIENT_API int pslab_client_end(pslab_client* c);

/* ---- The evaluator (rank PSLAB_CLIENT_EVALUATOR), after pslab_client_connect ----
 * next_theta writes to theta the next θ taken when it was due (every eval.interval_s, or
 * eval.every_epochs of samples applied, and at the end of training), waiting for it if need be;
 * info->training_done: the last one. A thread of the client's takes them, at the priority of the
 * thread that first calls next_theta, into a queue, while the caller evaluates (its own thread's
 * priority may then be lowered, as pslab_worker's evaluator does: nice 10), so that a slow
 * evaluation loses no tick.
 * eval writes the metrics line of that θ's evaluation ({"kind": "eval"}, as pslab_worker's
 * evaluator; test_acc < 0: none, regression) to run_dir/metrics/evaluator.jsonl (after
 * pslab_client_metrics). shutdown asks every server to exit, after the last evaluation. */
PSLAB_CLIENT_API int pslab_client_next_theta(pslab_client* c, float* theta, pslab_pull_info* info);
PSLAB_CLIENT_API int pslab_client_eval(pslab_client* c, double test_loss, double test_acc);
PSLAB_CLIENT_API int pslab_client_shutdown(pslab_client* c);

/* ---- The parts, for a loop of one's own ---- */
/* Hello to every server; returns once every worker of the run has said Hello (the start barrier). */
PSLAB_CLIENT_API int pslab_client_connect(pslab_client* c);
/* θ for step `clock` into theta (P floats). info may be NULL. */
PSLAB_CLIENT_API int pslab_client_pull(pslab_client* c, long clock, float* theta, pslab_pull_info* info);
/* The gradient (P floats) computed at `clock` on the θ last pulled, over `batch` samples. With
 * theta not NULL the servers answer with θ for clock + 1, written there; else they acknowledge. */
PSLAB_CLIENT_API int pslab_client_push(pslab_client* c, long clock, int batch, const float* grad, float* theta,
                                       pslab_pull_info* info);
/* This worker is done (after its last push, at the clock after it). */
PSLAB_CLIENT_API int pslab_client_bye(pslab_client* c, long clock);
/* Ends the client (its connections and heartbeat thread); NULL is allowed. */
PSLAB_CLIENT_API void pslab_client_close(pslab_client* c);

#ifdef __cplusplus
}
#endif

#endif /* PSLAB_CLIENT_H */
