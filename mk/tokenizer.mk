# The tokenizer's parity with the Hugging Face `tokenizers` package (tests/tokenizer):
# fastformer-tokenize against tokenizers (pip-installed into .venv-tokenizer on first use) on
# TOKENIZER_TEXTS real texts of this machine (/usr/share/locale, /usr/share/doc) and an
# every-code-point sweep. Fails on any text whose ids differ.
TOKENIZER_TEXTS ?= 100000
TOKENIZER_VENV ?= .venv-tokenizer

.PHONY: test-tokenizer

$(TOKENIZER_VENV)/bin/python:
	/usr/bin/python3 -m venv --system-site-packages $(TOKENIZER_VENV)
	$(TOKENIZER_VENV)/bin/pip install -q 'tokenizers>=0.20,<0.24'

test-tokenizer: build $(TOKENIZER_VENV)/bin/python
	$(TOKENIZER_VENV)/bin/python tests/tokenizer/compare_hf.py --bin $(BUILD_DIR)/bin/fastformer-tokenize \
	  --texts $(TOKENIZER_TEXTS) --out $(BUILD_DIR)/tokenizer-parity
