"""The peer of the local model's benchmark (bench/results/2026-12-01-diary.md,
"embed-batcher's model"): the same texts embedded by sentence-transformers (PyTorch, CPU) from
the same model folder, the same way as examples/embed_bench.rs does.
bench/model_bench.sh runs both, with a virtualenv it makes.

    # ~100-word texts, the same for both (deterministic; standard library only):
    python3 bench/embed/sentence_transformers_bench.py texts /var/tmp/embed-texts.jsonl
    # sentence-transformers, in a virtualenv with sentence-transformers and torch:
    HF_HUB_OFFLINE=1 VENV/bin/python \
        bench/embed/sentence_transformers_bench.py run /var/tmp/embed-texts.jsonl

The model is $MODELS_DIR/all-MiniLM-L6-v2 (MODELS_DIR defaulting to
/var/tmp/streams-models), on MODEL_THREADS threads (default 2,
torch.set_num_threads). Embeds all the texts in batches of 32 and of 50,
ROUNDS rounds (default 5) per batch size after a warm-up batch, and prints per
batch size the embeddings per second of the rounds (min / median / max) and
the CPU time of the process per embedding; then the process's peak RSS
(VmHWM) and its RSS with the model loaded, before any batch.
"""

import json
import os
import random
import sys
import time
from pathlib import Path

SENTENCES = [
    "Open the settings page and choose security to change your password.",
    "Invoices can be exported to CSV or PDF from the billing section.",
    "The quarterly report shows revenue growing faster than costs.",
    "Our support team answers most questions within one working day.",
    "A cold front will bring rain and strong winds to the coast tonight.",
    "The new release improves search speed and fixes several crashes.",
    "Shipping to most countries takes between three and seven days.",
    "You can invite colleagues to a workspace and give them roles.",
    "Two-factor authentication protects the account if a password leaks.",
    "The museum reopens next month with a collection of modern paintings.",
    "Whisk the eggs with sugar until pale, then fold in the flour.",
    "The striker scored twice in the second half to win the match.",
    "Data is encrypted at rest and in transit with current standards.",
    "Refunds are issued to the original payment method within a week.",
    "The API limits each key to one hundred requests per second.",
    "Volunteers planted four hundred trees along the river last spring.",
    "Subscriptions renew automatically unless they are cancelled first.",
    "The conference keynote covered stream processing at large scale.",
    "Battery life improved by a fifth after the firmware update.",
    "Please attach a screenshot when you report a problem with the app.",
    "The library lends laptops to students for up to two weeks.",
    "Prices include tax in the European Union but not in other regions.",
    "The train was delayed by forty minutes because of a signal failure.",
    "Backups run every night and are kept for thirty days.",
    "The recipe needs fresh basil, ripe tomatoes and good olive oil.",
    "Administrators can turn off password resets for managed accounts.",
    "The hotel offers free breakfast and a shuttle to the airport.",
    "Scientists measured the glacier shrinking faster than predicted.",
    "Use filters to find orders by date, customer or status.",
    "The webinar recording will be available to everyone who registered.",
]


def make_texts(count=400, words=100, seed=7):
    """`count` texts of `words` words, each a title and a body of sentences."""
    rng = random.Random(seed)
    texts = []
    for i in range(count):
        body = []
        while len(body) < words:
            body.extend(rng.choice(SENTENCES).split())
        title = f"Article {i}: " + " ".join(rng.choice(SENTENCES).split()[:4])
        texts.append(title + "\n\n" + " ".join(body[: words - len(title.split())]))
    return texts


def rss_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def run(path):
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(int(os.environ.get("MODEL_THREADS", "2")))
    rounds = max(1, int(os.environ.get("ROUNDS", "5")))
    texts = [json.loads(line) for line in Path(path).read_text().splitlines()]
    model_dir = Path(os.environ.get("MODELS_DIR", "/var/tmp/streams-models")) / "all-MiniLM-L6-v2"
    model = SentenceTransformer(str(model_dir), device="cpu")
    loaded_rss = rss_kib("VmRSS")
    print(
        f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {len(texts)} texts, {rounds} rounds"
    )
    for batch_size in (32, 50):
        batches = [texts[i : i + batch_size] for i in range(0, len(texts) - batch_size + 1, batch_size)]
        model.encode(batches[0], batch_size=batch_size)  # warm-up
        rates = []
        cpu_before = time.process_time()
        for _ in range(rounds):
            started = time.perf_counter()
            for batch in batches:
                model.encode(batch, batch_size=batch_size, convert_to_numpy=True)
            elapsed = time.perf_counter() - started
            rates.append(len(batches) * batch_size / elapsed)
        cpu_ms = (time.process_time() - cpu_before) * 1000 / (rounds * len(batches) * batch_size)
        rates.sort()
        print(
            f"batch {batch_size}: {rates[0]:.1f} / {rates[len(rates) // 2]:.1f} / {rates[-1]:.1f} "
            f"embeddings/s (min / median / max); {cpu_ms:.1f} CPU-ms per embedding"
        )
    print(f"peak RSS {rss_kib('VmHWM') // 1024} MiB; RSS with the model loaded {loaded_rss // 1024} MiB")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "texts":
        with open(sys.argv[2], "w") as out:
            for text in make_texts():
                out.write(json.dumps(text) + "\n")
    elif len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
