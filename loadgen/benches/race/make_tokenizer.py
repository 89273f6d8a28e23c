"""A small byte-level BPE tokenizer, saved as a Hugging Face tokenizer folder.

The peers count prompt and output tokens with a Hugging Face tokenizer and
these machines reach no model hub, so the race gives every tool the same
local one: trained here, deterministically, on a fixed text.

    python make_tokenizer.py OUT_DIR
"""

import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

WORDS = (
    "the of and to in is was for on that with as by at from his her it an "
    "were are which this be or has had not but what all when their there "
    "request token latency prefill decode batch cache server client model "
    "schedule queue memory block stream chunk answer question time rate "
).split()


def corpus():
    # A fixed pseudo-text: every word next to every other, many times.
    for i in range(2000):
        yield " ".join(WORDS[(i * k + k * k) % len(WORDS)] for k in range(1, 40))


def main(out):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=1_000_000,
    )
    fast.save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])
