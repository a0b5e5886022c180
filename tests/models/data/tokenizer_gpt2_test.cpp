// GPT-2's built-in byte-level BPE against golden ids.
//
// How the expected ids were produced (independently of this code): tiktoken 0.14, in a throwaway
// virtual environment outside the repository, built from this repository's own vocabulary files with
// tiktoken's `gpt2` pattern and nothing downloaded:
//   ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks("data/tokenizers/gpt2/vocab.bpe",
//                                                          "data/tokenizers/gpt2/encoder.json")
//   enc = tiktoken.Encoding(name="gpt2_local", pat_str=tiktoken_ext.openai_public.r50k_pat_str,
//                           mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
//   enc.encode_ordinary(text)                        # the kGolden table
//   enc.encode(text, allowed_special="all")          # SpecialTokenParsed
// tiktoken takes only valid Unicode; for bytes that are not valid UTF-8 (InvalidUtf8) the expected
// ids follow cpformer's documented rule (an invalid byte is pre-tokenized as U+FFFD would be, but
// encoded as its own byte), computed with tiktoken's own merge on the pieces that rule gives:
//   [i for p in pieces for i in enc._encode_single_piece(p)]
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "models/data/bpe_pretokenizer.h"
#include "models/data/gpt2_tokenizer.h"

namespace cpf::models::data {
namespace {

struct GoldenCase {
  const char* name;
  std::string text;
  std::vector<int64_t> ids;
};

const std::vector<GoldenCase> kGolden = {
    {"english",
     "Hello, world! It's 2024 and we're testing GPT-2's tokenizer.",
     {15496, 11, 995, 0, 632, 338, 48609, 290, 356, 821, 4856, 402, 11571, 12, 17, 338, 11241, 7509, 13}},
    {"contractions",
     "I'm sure they'll say you've done what he'd've, isn't it? DON'T 'S 're",
     {40, 1101, 1654, 484, 1183, 910,   345, 1053, 1760, 644, 339, 1549, 1053,
      11, 2125, 470,  340, 30,   23917, 6,   51,   705,  50,  705, 260}},
    {"multibyte",
     "naïve café — 日本語のテキスト, Ελληνικά, русский текст",
     {2616,  38776, 40304, 851,   10545, 245, 98,  17312, 105,   45739, 252,   5641,  24336, 25084, 43302,
      11,    7377,  243,   39377, 39377, 138, 115, 26180, 29945, 43000, 138,   105,   11,    220,   21169,
      35072, 21727, 21727, 31583, 18849, 140, 117, 220,   20375, 16843, 31583, 21727, 20375}},
    {"emoji",
     "emoji 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flags 🇫🇷!",
     {368, 31370, 30325, 222, 41840, 235, 8582,  237, 121,  1641,  50169, 101, 447,  235, 41840, 102,
      447, 235,   41840, 100, 447,   235, 41840, 99,  9701, 12520, 229,   104, 8582, 229, 115,   0}},
    {"whitespace",
     "  leading\n\n\nlines   three spaces\t\ttabs \n trailing   ",
     {220, 3756, 628, 198, 6615, 220, 220, 1115, 9029, 197, 197, 8658, 82, 220, 198, 25462, 220, 220, 220}},
    {"digits",
     "1234567890 3.14159 1,000,000 0x1F 2^32=4294967296 007",
     {10163, 2231, 30924, 3829, 513, 13,   1415, 19707, 352,  11,   830,   11,   830, 657,
      87,    16,   37,    362,  61,  2624, 28,   11785, 2920, 3134, 27137, 3571, 22}},
    {"code",
     "def f(x):\n    return x**2  # square\n\n\nprint(f(3))\n",
     {4299, 277,  7,    87,  2599, 198,  220, 220, 220, 1441, 2124, 1174, 17,
      220,  1303, 6616, 628, 198,  4798, 7,   69,  7,   18,   4008, 198}},
    {"unicode_space",
     "Ünïcödé\u00a0nbsp\u2003em\x0bvt\u0085nel\u3000ideo",
     {127, 250, 77,  26884, 66,    9101, 67,  2634, 1849, 77,  24145,
      447, 225, 368, 199,   36540, 126,  227, 4954, 5099, 222, 1651}},
    {"paragraph",
     "The quick brown fox jumps over the lazy dog. Tokenization splits text into pieces; byte-level BPE never fails, "
     "because every byte is a token of its own. Supercalifragilisticexpialidocious antidisestablishmentarianism!!!",
     {464,  2068,  7586, 21831, 18045, 625, 262,   16931, 3290,  13,    29130, 1634, 30778,
      2420, 656,   5207, 26,    18022, 12,  5715,  347,   11401, 1239,  10143, 11,   780,
      790,  18022, 318,  257,   11241, 286, 663,   898,   13,    3115,  9948,  361,  22562,
      346,  396,   501,  42372, 498,   312, 32346, 1885,  29207, 44390, 3699,  1042, 10185}},
    {"endoftext_as_text", "before<|endoftext|>after", {19052, 27, 91, 437, 1659, 5239, 91, 29, 8499}},
};

TEST(Gpt2Tokenizer, VocabularyAndEndOfText) {
  const auto tok = load_tokenizer("gpt2");
  EXPECT_EQ(tok->name(), "gpt2");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eot_token(), 50256);
  EXPECT_EQ(tok.get(), gpt2_tokenizer().get()) << "parsed once per process";
  // The embedded files are the shipped ones (sizes of OpenAI's files).
  EXPECT_EQ(gpt2_encoder_json().size(), 1042301u);
  EXPECT_EQ(gpt2_vocab_bpe().size(), 456318u);
}

TEST(Gpt2Tokenizer, MatchesTiktokenOnHardInputs) {
  const auto tok = gpt2_tokenizer();
  for (const GoldenCase& c : kGolden) {
    EXPECT_EQ(tok->encode(c.text), c.ids) << c.name;
    EXPECT_EQ(tok->decode(c.ids), c.text) << c.name;
  }
}

// The letter and number classes come from the bundled Unicode 16.0 table, the version of tiktoken's
// regex crate, whatever the ICU the build links knows (Debian 12's ICU 72: Unicode 15.0). These
// characters were assigned in 16.0: U+13460 (Egyptian Hieroglyphs Extended-A, Lo), U+1C89/U+1C8A
// (Cyrillic Tje, Lu/Ll), U+10D40/U+10D41 (Garay digits, Nd), U+10D50/U+10D51 (Garay capitals, Lu)
// and U+16D70 (Kirat Rai digit zero, Nd). With ICU 72's classes they were cut out of the words around them; the ids
// are tiktoken's (enc.encode_ordinary as in the header).
TEST(Gpt2Tokenizer, CharactersOfUnicode16AreClassedAsTiktokenDoes) {
  EXPECT_EQ(models::data::pretokenizer_unicode_version(), "16.0");
  const models::data::BpePreTokenizer gpt2(models::data::kGpt2Pattern);
  EXPECT_EQ(gpt2.split("a\U00013460b").size(), 1u) << "a letter of 16.0 stays inside the word";
  EXPECT_EQ(gpt2.split("a\u00e9b").size(), 1u) << "an older letter (U+00E9) too";
  const std::vector<GoldenCase> unicode16 = {
      {"hieroglyph", "a\U00013460b", {64, 172, 241, 239, 254, 65}},
      {"cyrillic tje", "\u1C89ello world", {157, 110, 231, 11109, 995}},
      {"garay and kirat rai",
       "x\U00010D40\U00010D41y 12\U00016D70",
       {87, 172, 238, 113, 222, 172, 238, 113, 223, 88, 1105, 172, 244, 113, 108}},
      {"garay word", " \U00010D50\U00010D51 and", {220, 172, 238, 113, 238, 172, 238, 113, 239, 290}},
      {"tje pair", "Tje: \u1C89\u1C8A!", {51, 18015, 25, 28053, 110, 231, 157, 110, 232, 0}},
  };
  const auto tok = gpt2_tokenizer();
  for (const GoldenCase& c : unicode16) {
    EXPECT_EQ(tok->encode(c.text), c.ids) << c.name;
    EXPECT_EQ(tok->decode(c.ids), c.text) << c.name;
  }
}

TEST(Gpt2Tokenizer, EmptyTextHasNoTokens) {
  EXPECT_TRUE(gpt2_tokenizer()->encode("").empty());
  EXPECT_EQ(gpt2_tokenizer()->decode({}), "");
}

TEST(Gpt2Tokenizer, SpecialTokenParsedOnlyWhenAsked) {
  const auto tok = gpt2_tokenizer();
  const std::string text = "<|endoftext|>Once upon a time<|endoftext|> the end";
  EXPECT_EQ(tok->encode(text, SpecialTokens::parse),
            (std::vector<int64_t>{50256, 7454, 2402, 257, 640, 50256, 262, 886}));
  const std::vector<int64_t> plain = tok->encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0) << "training text never yields end-of-text";
  EXPECT_EQ(tok->decode(plain), text);
  EXPECT_EQ(tok->decode({7454, 50256, 262}), "Once<|endoftext|> the");
}

TEST(Gpt2Tokenizer, InvalidUtf8BytesRoundTrip) {
  const auto tok = gpt2_tokenizer();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> cases = {
      {"ab\xff"
       "cd",
       {397, 187, 10210}},
      {" \xff\xfe!", {220, 187, 186, 0}},
      {"caf\xc3", {66, 1878, 127}},              // a sequence cut short
      {"\xc0\xafx", {124, 107, 87}},             // an overlong '/'
      {"hi \x80 there", {5303, 220, 222, 612}},  // a lone continuation byte
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok->encode(text), ids) << text;
    EXPECT_EQ(tok->decode(ids), text);
  }
}

TEST(Gpt2Tokenizer, AnyBytesRoundTrip) {
  const auto tok = gpt2_tokenizer();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 64, '\0');
    // Half the strings from a small alphabet (more merges), half from all 256 byte values.
    for (char& c : text) c = static_cast<char>(trial % 2 ? rng() % 256 : " aeth\n'0"[rng() % 8]);
    const std::vector<int64_t> ids = tok->encode(text);
    for (int64_t id : ids) ASSERT_TRUE(id >= 0 && id < 50256) << id;
    ASSERT_EQ(tok->decode(ids), text) << "trial " << trial;
  }
}

TEST(Gpt2Tokenizer, LongPieceIsFastAndExact) {
  // One 200,000-letter "word": the heap merge keeps this O(n log n).
  std::string word;
  for (int i = 0; i < 20000; ++i) word += "abcdefghij";
  const auto ids = gpt2_tokenizer()->encode(word);
  EXPECT_LT(ids.size(), word.size() / 2);
  EXPECT_EQ(gpt2_tokenizer()->decode(ids), word);
}

TEST(Gpt2Tokenizer, UnknownIdsRenderAsNumbers) {
  EXPECT_EQ(gpt2_tokenizer()->decode({15496, 50300, -1}), "Hello<50300><-1>");
}

TEST(LoadTokenizer, RejectsUnknownNamesAndMissingFiles) {
  const auto message = [](const std::string& spec) {
    try {
      load_tokenizer(spec);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(message("gpt3").find("tokenizer 'gpt3' is not a known name or a tokenizer file (bytes | gpt2 |"),
            std::string::npos)
      << message("gpt3");
  EXPECT_NE(message("").find("no tokenizer named"), std::string::npos);
  EXPECT_NE(message("/nonexistent/tokenizer.json").find("tokenizer file '/nonexistent/tokenizer.json' does not exist"),
            std::string::npos);
  EXPECT_NE(message("/nonexistent/m.model").find("does not exist"), std::string::npos);
}

TEST(LoadTokenizer, BytesIsTheTextSourceVocabulary) {
  const auto tok = load_tokenizer("bytes");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eot_token(), 256);
  EXPECT_EQ(tok->encode("h\xc3\xa9"), (std::vector<int64_t>{104, 0xc3, 0xa9}));
  EXPECT_EQ(tok->encode("a<|endoftext|>", SpecialTokens::parse), (std::vector<int64_t>{97, 256}));
  EXPECT_EQ(tok->decode({104, 256, 300}), "h<|endoftext|><300>");
}

}  // namespace
}  // namespace cpf::models::data
