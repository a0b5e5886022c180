# cmake -DIN=<file> -DOUT=<file.inc> -P EmbedText.cmake: writes IN's text as one C++ raw string literal,
# for tests that read a source file's text and must run from any folder (the GPU machines run carried
# binaries without the sources): `const std::string text =\n#include "name.inc"\n;`.
file(READ "${IN}" text)
string(FIND "${text}" ")cpf_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "EmbedText: ${IN} contains the raw string delimiter )cpf_embed\"")
endif()
file(WRITE "${OUT}.tmp" "R\"cpf_embed(${text})cpf_embed\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
