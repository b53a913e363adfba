# The tokenizer's parity with the Hugging Face `tokenizers` package (tests/tokenizer):
# fastformer-tokenize against tokenizers (from PyPI, mk/cache.mk) on
# TOKENIZER_TEXTS real texts of this machine (/usr/share/locale, /usr/share/doc) and an
# every-code-point sweep. Fails on any text whose ids, or whose tokens' character offsets
# (--offsets: Encoding.offsets), differ. tokenizers comes from PyPI into
# $(TOKENIZER_VENV) (mk/cache.mk; tests/requirements/tokenizer.txt).
TOKENIZER_TEXTS ?= 100000

.PHONY: test-tokenizer

test-tokenizer: build $(TOKENIZER_VENV)/.complete
	$(TOKENIZER_VENV)/bin/python tests/tokenizer/compare_hf.py --bin $(BUILD_DIR)/bin/fastformer-tokenize \
	  --texts $(TOKENIZER_TEXTS) --out $(BUILD_DIR)/tokenizer-parity --offsets
