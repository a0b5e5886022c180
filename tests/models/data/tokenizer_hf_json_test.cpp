// Hugging Face tokenizer.json (byte-level BPE) loading, against ids from the `tokenizers` library.
//
// How the expected ids were produced: `tokenizers` 0.23 (Python, in a throwaway virtual environment
// outside the repository) loaded the exact JSON of kLlamaStyleJson (and, for NfcNormalizerComposesFirst,
// the same with "normalizer":{"type":"NFC"}) with Tokenizer.from_file and
// encoded each text with encode_special_tokens = True, add_special_tokens = False (special tokens in
// the text stay text, as cpformer's SpecialTokens::as_text), and once with encode_special_tokens =
// False for the parsed case. For the GPT-2 file this test writes, `tokenizers` gave the same ids as
// tiktoken on every input of tokenizer_gpt2_test.cpp (checked when the test was written), so the
// built-in tokenizer is the reference here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "models/data/gpt2_tokenizer.h"
#include "models/data/hf_tokenizer_json.h"

namespace cpf::models::data {
namespace {
namespace fs = std::filesystem;

// Llama 3's pre-tokenizer pattern, ignore_merges, 256 byte tokens (ids = byte values), 10 merges,
// "world" (266) that no merge makes, and two added tokens.
const char* kLlamaStyleJson = R"json(
{"version":"1.0","added_tokens":[{"id":267,"content":"<|begin_of_text|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},{"id":268,"content":"<|end_of_text|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":true,"vocab":{"\u0100":0,"\u0101":1,"\u0102":2,"\u0103":3,"\u0104":4,"\u0105":5,"\u0106":6,"\u0107":7,"\u0108":8,"\u0109":9,"\u010a":10,"\u010b":11,"\u010c":12,"\u010d":13,"\u010e":14,"\u010f":15,"\u0110":16,"\u0111":17,"\u0112":18,"\u0113":19,"\u0114":20,"\u0115":21,"\u0116":22,"\u0117":23,"\u0118":24,"\u0119":25,"\u011a":26,"\u011b":27,"\u011c":28,"\u011d":29,"\u011e":30,"\u011f":31,"\u0120":32,"!":33,"\"":34,"#":35,"$":36,"%":37,"&":38,"'":39,"(":40,")":41,"*":42,"+":43,",":44,"-":45,".":46,"/":47,"0":48,"1":49,"2":50,"3":51,"4":52,"5":53,"6":54,"7":55,"8":56,"9":57,":":58,";":59,"<":60,"=":61,">":62,"?":63,"@":64,"A":65,"B":66,"C":67,"D":68,"E":69,"F":70,"G":71,"H":72,"I":73,"J":74,"K":75,"L":76,"M":77,"N":78,"O":79,"P":80,"Q":81,"R":82,"S":83,"T":84,"U":85,"V":86,"W":87,"X":88,"Y":89,"Z":90,"[":91,"\\":92,"]":93,"^":94,"_":95,"`":96,"a":97,"b":98,"c":99,"d":100,"e":101,"f":102,"g":103,"h":104,"i":105,"j":106,"k":107,"l":108,"m":109,"n":110,"o":111,"p":112,"q":113,"r":114,"s":115,"t":116,"u":117,"v":118,"w":119,"x":120,"y":121,"z":122,"{":123,"|":124,"}":125,"~":126,"\u0121":127,"\u0122":128,"\u0123":129,"\u0124":130,"\u0125":131,"\u0126":132,"\u0127":133,"\u0128":134,"\u0129":135,"\u012a":136,"\u012b":137,"\u012c":138,"\u012d":139,"\u012e":140,"\u012f":141,"\u0130":142,"\u0131":143,"\u0132":144,"\u0133":145,"\u0134":146,"\u0135":147,"\u0136":148,"\u0137":149,"\u0138":150,"\u0139":151,"\u013a":152,"\u013b":153,"\u013c":154,"\u013d":155,"\u013e":156,"\u013f":157,"\u0140":158,"\u0141":159,"\u0142":160,"\u00a1":161,"\u00a2":162,"\u00a3":163,"\u00a4":164,"\u00a5":165,"\u00a6":166,"\u00a7":167,"\u00a8":168,"\u00a9":169,"\u00aa":170,"\u00ab":171,"\u00ac":172,"\u0143":173,"\u00ae":174,"\u00af":175,"\u00b0":176,"\u00b1":177,"\u00b2":178,"\u00b3":179,"\u00b4":180,"\u00b5":181,"\u00b6":182,"\u00b7":183,"\u00b8":184,"\u00b9":185,"\u00ba":186,"\u00bb":187,"\u00bc":188,"\u00bd":189,"\u00be":190,"\u00bf":191,"\u00c0":192,"\u00c1":193,"\u00c2":194,"\u00c3":195,"\u00c4":196,"\u00c5":197,"\u00c6":198,"\u00c7":199,"\u00c8":200,"\u00c9":201,"\u00ca":202,"\u00cb":203,"\u00cc":204,"\u00cd":205,"\u00ce":206,"\u00cf":207,"\u00d0":208,"\u00d1":209,"\u00d2":210,"\u00d3":211,"\u00d4":212,"\u00d5":213,"\u00d6":214,"\u00d7":215,"\u00d8":216,"\u00d9":217,"\u00da":218,"\u00db":219,"\u00dc":220,"\u00dd":221,"\u00de":222,"\u00df":223,"\u00e0":224,"\u00e1":225,"\u00e2":226,"\u00e3":227,"\u00e4":228,"\u00e5":229,"\u00e6":230,"\u00e7":231,"\u00e8":232,"\u00e9":233,"\u00ea":234,"\u00eb":235,"\u00ec":236,"\u00ed":237,"\u00ee":238,"\u00ef":239,"\u00f0":240,"\u00f1":241,"\u00f2":242,"\u00f3":243,"\u00f4":244,"\u00f5":245,"\u00f6":246,"\u00f7":247,"\u00f8":248,"\u00f9":249,"\u00fa":250,"\u00fb":251,"\u00fc":252,"\u00fd":253,"\u00fe":254,"\u00ff":255,"\u0120t":256,"he":257,"\u0120the":258,"in":259,"12":260,"123":261,"ll":262,"ell":263,"ello":264,"\u0120w":265,"world":266},"merges":[["\u0120","t"],["h","e"],["\u0120t","he"],["i","n"],["1","2"],["12","3"],["l","l"],["e","ll"],["ell","o"],["\u0120","w"]]}})json";

std::string json_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// GPT-2 as a tokenizer.json, from the embedded encoder.json and vocab.bpe.
std::string gpt2_tokenizer_json() {
  std::string merges;
  const std::string_view bpe = gpt2_vocab_bpe();
  size_t begin = bpe.find('\n') + 1;
  while (begin < bpe.size()) {
    size_t end = bpe.find('\n', begin);
    if (end == std::string_view::npos) end = bpe.size();
    if (end > begin) merges += (merges.empty() ? "\"" : ",\"") + json_escape(bpe.substr(begin, end - begin)) + "\"";
    begin = end + 1;
  }
  return R"({"version":"1.0","added_tokens":[{"id":50256,"content":"<|endoftext|>","special":true}],)"
         R"("normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},)"
         R"("decoder":{"type":"ByteLevel"},"model":{"type":"BPE","dropout":null,"vocab":)" +
         std::string(gpt2_encoder_json()) + R"(,"merges":[)" + merges + "]}}";
}

class HfTokenizerJsonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cpf_hf_tok_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // The message load_tokenizer throws for a file holding `text`.
  std::string error_for(const std::string& text) {
    try {
      load_tokenizer(write("bad.json", text));
    } catch (const Error& e) {
      return e.message();
    }
    return "no error";
  }
  fs::path dir_;
};

TEST_F(HfTokenizerJsonTest, Gpt2FileEncodesLikeTheBuiltIn) {
  const auto hf = load_tokenizer(write("tokenizer.json", gpt2_tokenizer_json()));
  const auto builtin = gpt2_tokenizer();
  EXPECT_EQ(hf->vocab_size(), 50257);
  EXPECT_EQ(hf->eot_token(), 50256);
  for (const std::string text :
       {"Hello, world! It's 2024 and we're testing GPT-2's tokenizer.", "na\xc3\xafve caf\xc3\xa9 \xf0\x9f\x98\x80",
        "  leading\n\n\nlines   three spaces\t\ttabs \n trailing   ", "1234567890 3.14159 DON'T 'S 're",
        "before<|endoftext|>after"}) {
    EXPECT_EQ(hf->encode(text), builtin->encode(text)) << text;
    EXPECT_EQ(hf->decode(hf->encode(text)), text);
  }
  EXPECT_EQ(hf->encode("a<|endoftext|>b", SpecialTokens::parse), (std::vector<int64_t>{64, 50256, 65}));
}

TEST_F(HfTokenizerJsonTest, AddPrefixSpaceStartsTextWithASpace) {
  std::string text = gpt2_tokenizer_json();
  const std::string off = R"("add_prefix_space":false)";
  text.replace(text.find(off), off.size(), R"("add_prefix_space":true)");
  const auto hf = load_tokenizer(write("prefix.json", text));
  const auto builtin = gpt2_tokenizer();
  EXPECT_EQ(hf->encode("Hello world"), builtin->encode(" Hello world"));
  EXPECT_EQ(hf->encode(" Hello"), builtin->encode(" Hello")) << "a text that starts with a space gets none";
}

TEST_F(HfTokenizerJsonTest, LlamaStylePatternAndIgnoreMergesMatchTokenizers) {
  const auto tok = load_tokenizer(write("llama.json", kLlamaStyleJson));
  EXPECT_EQ(tok->vocab_size(), 269);
  EXPECT_EQ(tok->eot_token(), 268) << "<|end_of_text|>";
  const std::vector<std::pair<std::string, std::vector<int64_t>>> cases = {
      {"world", {266}},
      {"Hello hello world's 12345 THE'S\n\n  the end",
       {72, 264, 32, 257, 262, 111, 265, 111, 114, 108, 100, 39, 115, 32,  261, 52,
        53, 32,  84, 72,  69,  39,  83,  10,  10,  32,  258, 32, 101, 110, 100}},
      {"the world, hell\xc3\xb6!\r\n\n x",
       {116, 257, 265, 111, 114, 108, 100, 44, 32, 257, 262, 195, 182, 33, 13, 10, 10, 32, 120}},
      {"123456789 helloworld", {261, 52, 53, 54, 55, 56, 57, 32, 257, 262, 111, 119, 111, 114, 108, 100}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok->encode(text), ids) << text;
    EXPECT_EQ(tok->decode(ids), text);
  }
  EXPECT_EQ(tok->encode("<|begin_of_text|>the<|end_of_text|>", SpecialTokens::parse),
            (std::vector<int64_t>{267, 116, 257, 268}));
}

TEST_F(HfTokenizerJsonTest, NfcNormalizerComposesFirst) {
  std::string text = kLlamaStyleJson;
  const std::string null_normalizer = R"("normalizer":null)";
  text.replace(text.find(null_normalizer), null_normalizer.size(), R"("normalizer":{"type":"NFC"})");
  const auto tok = load_tokenizer(write("nfc.json", text));
  // e + U+0301 (combining acute) becomes U+00E9; U+212B (Angstrom sign) becomes U+00C5.
  EXPECT_EQ(tok->encode("cafe\xcc\x81 the\xcc\x81"), (std::vector<int64_t>{99, 97, 102, 195, 169, 256, 104, 195, 169}));
  EXPECT_EQ(tok->encode("Ame\xcc\x81lie \xe2\x84\xab"),
            (std::vector<int64_t>{65, 109, 195, 169, 108, 105, 101, 32, 195, 133}));
  // Bytes that are not UTF-8 pass through unchanged around the normalized text.
  EXPECT_EQ(tok->decode(tok->encode("e\xcc\x81\xff")), "\xc3\xa9\xff");
}

TEST_F(HfTokenizerJsonTest, RefusesWhatIsNotByteLevelBpe) {
  const std::string base = kLlamaStyleJson;
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = base;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  EXPECT_NE(error_for("{not json").find("is not valid JSON"), std::string::npos);
  EXPECT_NE(error_for("{}").find("has no \"model\" (not a Hugging Face tokenizer.json)"), std::string::npos);
  EXPECT_NE(error_for(with(R"("type":"BPE")", R"("type":"WordPiece")")).find("only BPE models are supported"),
            std::string::npos);
  EXPECT_NE(error_for(with(R"("normalizer":null)", R"("normalizer":{"type":"NFKC"})"))
                .find(R"(: normalizer {"type":"NFKC"} is not supported)"),
            std::string::npos);
  EXPECT_NE(error_for(with(R"("byte_fallback":false)", R"("byte_fallback":true)")).find("byte_fallback is true"),
            std::string::npos);
  EXPECT_NE(error_for(with(R"("behavior":"Isolated")", R"("behavior":"Removed")")).find("Split behavior 'Removed'"),
            std::string::npos);
  EXPECT_NE(error_for(with("<|end_of_text|>", "<|eot|>")).find("no end-of-text token among added_tokens"),
            std::string::npos);
  EXPECT_NE(error_for(with(R"(["l","l"])", R"(["l","x"])")).find("which is not in the vocabulary"), std::string::npos);
  EXPECT_NE(error_for(with(R"("!":33,)", "")).find("has no token for byte 33"), std::string::npos);
  EXPECT_NE(error_for(with(R"x({"Regex":"(?i:)x", R"x({"Regex":"(?i:()x")).find("does not compile"), std::string::npos);
}

}  // namespace
}  // namespace cpf::models::data
