"""Article edits for embed-batcher's end-to-end benchmark (e2e_bench.sh), as
`streamctl produce --file` reads them: `TENANTS` tenants, `PER_TENANT` edits
each, every one a different document with a ~100-word text (the texts of
sentence_transformers_bench.py), 10 ms of event time apart, interleaved
across tenants; then one edit of tenant `clock` 60 s later, which moves the
watermark past every other edit so that every batch goes (its own edit stays
pending). Standard library only; deterministic.

    python3 bench/embed/articles.py TENANTS PER_TENANT OUT.jsonl
"""

import json
import sys

from sentence_transformers_bench import make_texts

T = 1_783_332_000_000


def edit(tenant, doc, text, at):
    title, body = text.split("\n\n", 1)
    return {"key": tenant, "value": {"tenant_id": tenant, "doc_id": doc, "title": title,
                                     "body": body, "updated_at": at}}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    tenants, per_tenant, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    texts = make_texts(count=tenants * per_tenant)
    with open(out, "w") as lines:
        for i, text in enumerate(texts):
            tenant = f"tenant-{i % tenants}"
            lines.write(json.dumps(edit(tenant, f"doc-{i // tenants}", text, T + 10 * i)) + "\n")
        last = T + 10 * len(texts) + 60_000
        lines.write(json.dumps(edit("clock", "clock", texts[0], last)) + "\n")


if __name__ == "__main__":
    main()
