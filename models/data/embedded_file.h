#pragma once
// Files assembled into the library's .rodata with the assembler's .incbin, so no file is looked up at
// run time wherever the binary goes. The directory is a string macro that models/CMakeLists.txt sets
// on the one source that embeds, and makes that object depend on the files. ccache never caches a
// source with .incbin, so a changed file is always picked up.
//
//   __asm__(CPF_EMBED_FILE(cpf_gpt2_vocab_bpe, CPF_GPT2_DIR "/vocab.bpe"));
//   CPF_DECLARE_EMBEDDED(cpf_gpt2_vocab_bpe)   // cpf_gpt2_vocab_bpe_begin[], _end[]
//
// The bytes are followed by a 0 byte (not counted between _begin and _end).
#define CPF_EMBED_FILE(symbol, path)    \
  ".section .rodata\n"                  \
  ".balign 16\n"                        \
  ".globl " #symbol                     \
  "_begin\n"                            \
  ".hidden " #symbol "_begin\n" #symbol \
  "_begin:\n"                           \
  ".incbin \"" path                     \
  "\"\n"                                \
  ".globl " #symbol                     \
  "_end\n"                              \
  ".hidden " #symbol "_end\n" #symbol   \
  "_end:\n"                             \
  ".byte 0\n"                           \
  ".previous\n"

#define CPF_DECLARE_EMBEDDED(symbol)                                        \
  extern "C" {                                                              \
  extern const char symbol##_begin[] __attribute__((visibility("hidden"))); \
  extern const char symbol##_end[] __attribute__((visibility("hidden")));   \
  }
