/* Times llama.cpp's prefill of given token ids: one llama_decode of the whole prompt.
 *
 *   prefill_driver MODEL.gguf PROMPTS.bin [PROMPTS.bin ...] [--host-experts N|all]
 *                  [--ubatch 2048] [--flash-attn on|off|auto] [--threads N]
 *                  [--load-mode auto|mmap|none] [--logits-dir DIR] [--verbose]
 *
 * Built against llama.cpp's `llama` library (bench/bench_whole_model.py builds both). A pack
 * made by `make-pack` has no vocabulary (tokenizer.ggml.model = none): llama.cpp loads it with
 * `vocab_size` placeholder tokens, which cannot tokenize text, so the prompts come as token ids.
 *
 * PROMPTS.bin (bench_whole_model.write_prompts): the 8 bytes "STPROMPT", then two little-endian
 * uint32, the prompt count P and the tokens per prompt N, then P * N little-endian int32 ids.
 * The first prompt is the warm-up, the rest are timed.
 *
 * The model is loaded once, every layer on the accelerator where there is one (n_gpu_layers
 * -1), with defaults as llama.cpp's own tools leave them (extra buffer types on, the file
 * memory-mapped: --load-mode auto). --host-experts N keeps the expert tensors of layers 0 to
 * N-1 in host memory as llama.cpp's `--n-cpu-moe N` does: one tensor buffer type override per
 * layer, the pattern `blk\.I\.ffn_(up|down|gate|gate_up)_(ch|)exps` on the CPU device's buffer
 * type (`all`: one pattern without the layer, as `--cpu-moe`). Memory-mapped, those tensors stay
 * in the file's pageable pages; with --load-mode none (llama.cpp's `--load-mode none`, which its
 * loader recommends beside CPU overrides) they are read into the GPU backend's page-locked host
 * buffer type. For each prompt file a context of its own: n_ctx and n_batch the prompt's length
 * (one llama_decode takes the whole prompt), n_ubatch min(--ubatch, N), F16 K and V caches,
 * flash attention as --flash-attn says (default on). Each prompt: the KV cache cleared, then
 * llama_decode of the N ids at positions 0..N-1 in sequence 0 with the last token's logits
 * requested, then llama_synchronize; the time is the host's monotonic clock around the two.
 *
 * Output (stdout): a JSON object a line: first the model (layers, vocabulary, bytes, devices,
 * host_experts, load_mode), then one per prompt file: tokens, the warm-up's seconds, every
 * timed prompt's seconds, their median, tokens per second (N over the median) and the context's
 * settings. With --logits-dir, the last prompt's logits (n_vocab little-endian float32) are
 * written to DIR/logits-N.f32. llama.cpp's own log goes to stderr: warnings and errors,
 * everything with --verbose. Exit 2 on bad arguments or a prompt file that cannot be read
 * (before the model is loaded) or holding an id outside the model's vocabulary (before any
 * prompt runs), 1 when llama.cpp fails.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-backend.h"
#include "llama.h"

#define MAX_FILES 64
/* llama.cpp's LLM_FFN_EXPS_REGEX (common/common.h): every expert tensor of a layer */
#define EXPS_ALL "\\.ffn_(up|down|gate|gate_up)_(ch|)exps"

typedef struct {
    const char *path;
    uint32_t n_prompts;
    uint32_t n_tokens;
    int32_t *ids; /* n_prompts * n_tokens */
} prompts_t;

static int verbose = 0;

static void die_usage(const char *msg, const char *arg) {
    fprintf(stderr, "prefill_driver: error: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

static void log_cb(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (verbose || level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t le32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Reads a prompt file whole; exits 2 naming the file and what is wrong with it. */
static prompts_t read_prompts(const char *path) {
    prompts_t p = {path, 0, 0, NULL};
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "prefill_driver: error: cannot open %s: %s\n", path, strerror(errno));
        exit(2);
    }
    unsigned char head[16];
    if (fread(head, 1, 16, f) != 16 || memcmp(head, "STPROMPT", 8) != 0) {
        fprintf(stderr, "prefill_driver: error: %s is not a prompt file (no STPROMPT header)\n", path);
        exit(2);
    }
    p.n_prompts = le32(head + 8);
    p.n_tokens = le32(head + 12);
    if (p.n_prompts < 2 || p.n_tokens < 1) {
        fprintf(stderr, "prefill_driver: error: %s holds %u prompts of %u tokens (needs a warm-up and "
                        "at least one timed prompt, of one token or more)\n", path, p.n_prompts, p.n_tokens);
        exit(2);
    }
    size_t n = (size_t)p.n_prompts * p.n_tokens;
    unsigned char *raw = malloc(4 * n);
    p.ids = malloc(sizeof(int32_t) * n);
    if (!raw || !p.ids) {
        fprintf(stderr, "prefill_driver: error: out of memory reading %s\n", path);
        exit(2);
    }
    if (fread(raw, 4, n, f) != n || fgetc(f) != EOF) {
        fprintf(stderr, "prefill_driver: error: %s: size does not match %u prompts of %u tokens\n",
                path, p.n_prompts, p.n_tokens);
        exit(2);
    }
    fclose(f);
    for (size_t i = 0; i < n; ++i) {
        p.ids[i] = (int32_t)le32(raw + 4 * i);
    }
    free(raw);
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double *s = malloc(sizeof(double) * n);
    memcpy(s, v, sizeof(double) * n);
    qsort(s, n, sizeof(double), cmp_double);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

/* Clears the KV cache, decodes one prompt and waits for its logits: the host seconds. */
static double timed_decode(struct llama_context *ctx, struct llama_batch *batch, const int32_t *ids,
                           int n, int *rc) {
    for (int i = 0; i < n; ++i) {
        batch->token[i] = ids[i];
        batch->pos[i] = i;
        batch->n_seq_id[i] = 1;
        batch->seq_id[i][0] = 0;
        batch->logits[i] = i == n - 1;
    }
    batch->n_tokens = n;
    llama_memory_clear(llama_get_memory(ctx), true);
    llama_synchronize(ctx);
    double t0 = now_s();
    *rc = llama_decode(ctx, *batch);
    llama_synchronize(ctx);
    return now_s() - t0;
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; ++s) {
        if (*s == '"' || *s == '\\') {
            putchar('\\');
        }
        if ((unsigned char)*s >= 0x20) {
            putchar(*s);
        }
    }
    putchar('"');
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *logits_dir = NULL;
    const char *files[MAX_FILES];
    int n_files = 0, host_experts = 0, ubatch = 2048, threads = 0;
    enum llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    enum llama_load_mode load_mode = LLAMA_LOAD_MODE_AUTO;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--verbose")) {
            verbose = 1;
        } else if (!strncmp(a, "--", 2)) {
            if (!v) {
                die_usage("missing value after", a);
            }
            char *end = NULL;
            long x = strtol(v, &end, 10);
            int is_int = end && *end == '\0' && end != v;
            if (!strcmp(a, "--host-experts")) {
                if (!strcmp(v, "all")) {
                    host_experts = -1;
                } else if (is_int && x >= 0 && x < 100000) {
                    host_experts = (int)x;
                } else {
                    die_usage("--host-experts takes a layer count or all", v);
                }
            } else if (!strcmp(a, "--ubatch")) {
                if (!is_int || x < 1 || x > 1 << 20) {
                    die_usage("--ubatch takes a positive token count", v);
                }
                ubatch = (int)x;
            } else if (!strcmp(a, "--threads")) {
                if (!is_int || x < 1 || x > 4096) {
                    die_usage("--threads takes a positive count", v);
                }
                threads = (int)x;
            } else if (!strcmp(a, "--flash-attn")) {
                if (!strcmp(v, "on")) {
                    fa = LLAMA_FLASH_ATTN_TYPE_ENABLED;
                } else if (!strcmp(v, "off")) {
                    fa = LLAMA_FLASH_ATTN_TYPE_DISABLED;
                } else if (!strcmp(v, "auto")) {
                    fa = LLAMA_FLASH_ATTN_TYPE_AUTO;
                } else {
                    die_usage("--flash-attn takes on, off or auto", v);
                }
            } else if (!strcmp(a, "--load-mode")) {
                if (!strcmp(v, "auto")) {
                    load_mode = LLAMA_LOAD_MODE_AUTO;
                } else if (!strcmp(v, "mmap")) {
                    load_mode = LLAMA_LOAD_MODE_MMAP;
                } else if (!strcmp(v, "none")) {
                    load_mode = LLAMA_LOAD_MODE_NONE;
                } else {
                    die_usage("--load-mode takes auto, mmap or none", v);
                }
            } else if (!strcmp(a, "--logits-dir")) {
                logits_dir = v;
            } else {
                die_usage("unknown option", a);
            }
            ++i;
        } else if (!model_path) {
            model_path = a;
        } else if (n_files < MAX_FILES) {
            files[n_files++] = a;
        } else {
            die_usage("too many prompt files", a);
        }
    }
    if (!model_path || n_files == 0) {
        die_usage("usage: prefill_driver MODEL.gguf PROMPTS.bin [PROMPTS.bin ...] [--host-experts N|all] "
                  "[--ubatch N] [--flash-attn on|off|auto] [--threads N] [--load-mode auto|mmap|none] "
                  "[--logits-dir DIR] [--verbose]", NULL);
    }
    FILE *probe = fopen(model_path, "rb");
    if (!probe) {
        fprintf(stderr, "prefill_driver: error: cannot open %s: %s\n", model_path, strerror(errno));
        return 2;
    }
    fclose(probe);
    prompts_t prompts[MAX_FILES];
    for (int i = 0; i < n_files; ++i) {
        prompts[i] = read_prompts(files[i]);
    }

    llama_log_set(log_cb, NULL);
    llama_backend_init(); /* the build links its backends in (GGML_BACKEND_DL off): nothing to load */

    /* The experts in host memory as llama.cpp's common arguments put them: `--n-cpu-moe N` adds
     * one override per layer 0..N-1, `--cpu-moe` (all) one pattern without a layer; each maps
     * the matching tensors to the CPU device's buffer type. The list ends with a NULL pattern. */
    int n_over = host_experts < 0 ? 1 : host_experts;
    struct llama_model_tensor_buft_override *overrides = calloc((size_t)n_over + 1, sizeof(*overrides));
    char **patterns = calloc((size_t)n_over + 1, sizeof(char *));
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (n_over > 0 && !cpu) {
        fprintf(stderr, "prefill_driver: error: llama.cpp has no CPU device to hold the experts\n");
        return 1;
    }
    for (int i = 0; i < n_over; ++i) {
        patterns[i] = malloc(64);
        if (host_experts < 0) {
            snprintf(patterns[i], 64, "%s", EXPS_ALL);
        } else {
            snprintf(patterns[i], 64, "blk\\.%d%s", i, EXPS_ALL);
        }
        overrides[i].pattern = patterns[i];
        overrides[i].buft = ggml_backend_dev_buffer_type(cpu);
    }

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = -1; /* every layer on the accelerator where there is one */
    mp.tensor_buft_overrides = n_over > 0 ? overrides : NULL;
    mp.load_mode = load_mode;
    double t_load = now_s();
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "prefill_driver: error: llama.cpp cannot load %s (its log above says why)\n", model_path);
        return 1;
    }
    t_load = now_s() - t_load;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    printf("{\"model\": ");
    json_str(model_path);
    printf(", \"desc\": ");
    json_str(desc);
    printf(", \"n_layer\": %d, \"n_vocab\": %d, \"bytes\": %llu, \"params\": %llu, \"host_experts\": ",
           llama_model_n_layer(model), n_vocab, (unsigned long long)llama_model_size(model),
           (unsigned long long)llama_model_n_params(model));
    if (host_experts < 0) {
        printf("\"all\"");
    } else {
        printf("%d", host_experts);
    }
    printf(", \"load_mode\": \"%s\", \"load_s\": %.3f, \"devices\": [", llama_load_mode_name(load_mode), t_load);
    for (size_t d = 0; d < ggml_backend_dev_count(); ++d) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(d);
        printf(d ? ", " : "");
        json_str(ggml_backend_dev_description(dev));
    }
    printf("]}\n");
    fflush(stdout);

    for (int f = 0; f < n_files; ++f) {
        const prompts_t *p = &prompts[f];
        int n = (int)p->n_tokens;
        for (size_t i = 0; i < (size_t)p->n_prompts * p->n_tokens; ++i) {
            if (p->ids[i] < 0 || p->ids[i] >= n_vocab) {
                fprintf(stderr, "prefill_driver: error: %s: token id %d outside the model's vocabulary of %d\n",
                        p->path, p->ids[i], n_vocab);
                return 2;
            }
        }
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t)n;
        cp.n_batch = (uint32_t)n;
        cp.n_ubatch = (uint32_t)(n < ubatch ? n : ubatch);
        cp.n_seq_max = 1;
        cp.flash_attn_type = fa;
        cp.type_k = GGML_TYPE_F16;
        cp.type_v = GGML_TYPE_F16;
        if (threads > 0) {
            cp.n_threads = threads;
            cp.n_threads_batch = threads;
        }
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            fprintf(stderr, "prefill_driver: error: llama.cpp cannot make a context of %d tokens\n", n);
            return 1;
        }
        struct llama_batch batch = llama_batch_init(n, 0, 1);
        int rc = 0;
        double warm = timed_decode(ctx, &batch, p->ids, n, &rc);
        int reps = (int)p->n_prompts - 1;
        double *times = malloc(sizeof(double) * reps);
        for (int r = 0; r < reps && rc == 0; ++r) {
            times[r] = timed_decode(ctx, &batch, p->ids + (size_t)(r + 1) * n, n, &rc);
        }
        if (rc != 0) {
            fprintf(stderr, "prefill_driver: error: llama_decode returned %d at %d tokens\n", rc, n);
            return 1;
        }
        if (logits_dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/logits-%d.f32", logits_dir, n);
            FILE *out = fopen(path, "wb");
            const float *logits = llama_get_logits_ith(ctx, -1);
            if (!out || !logits || fwrite(logits, sizeof(float), (size_t)n_vocab, out) != (size_t)n_vocab) {
                fprintf(stderr, "prefill_driver: error: cannot write %s\n", path);
                return 1;
            }
            fclose(out);
        }
        double med = median(times, reps);
        printf("{\"tokens\": %d, \"warmup_s\": %.6f, \"times_s\": [", n, warm);
        for (int r = 0; r < reps; ++r) {
            printf("%s%.6f", r ? ", " : "", times[r]);
        }
        printf("], \"median_s\": %.6f, \"tokens_per_s\": %.3f, \"n_ctx\": %u, \"n_batch\": %u, \"n_ubatch\": %u, "
               "\"flash_attn\": \"%s\", \"threads\": %d}\n",
               med, n / med, llama_n_ctx(ctx), cp.n_batch, cp.n_ubatch, llama_flash_attn_type_name(fa),
               cp.n_threads_batch);
        fflush(stdout);
        free(times);
        llama_batch_free(batch);
        llama_free(ctx);
    }
    llama_model_free(model);
    for (int i = 0; i < n_over; ++i) {
        free(patterns[i]);
    }
    free(patterns);
    free(overrides);
    llama_backend_free();
    return 0;
}
