#include "config/choice_task.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/token_files.h"
#include "config/proto_yaml.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

// Ordered: a document's fields are listed in errors in the order the data file gives them, and
// a dict is rendered as Python would, in insertion order.
using Json = nlohmann::ordered_json;

// ---- Values, as Python sees them ----------------------------------------------------------

// Python's name of a value's type, so that errors read like the harness's own.
std::string TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "NoneType";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "int";
    case Json::value_t::number_float:
      return "float";
    case Json::value_t::string:
      return "str";
    case Json::value_t::array:
      return "list";
    case Json::value_t::object:
      return "dict";
    default:
      return "value";
  }
}

// An int in Python's sense: JSON's booleans are not (Python's are, but no task file relies on
// indexing with True).
// "an int", "a str": a type's name for a sentence.
std::string AType(const Json& v) {
  const std::string name = TypeName(v);
  return absl::StrCat(name == "int" ? "an " : "a ", name);
}

bool IsInt(const Json& v) { return v.is_number_integer(); }
bool IsNumber(const Json& v) { return v.is_number(); }

// Python's repr() of a float: the shortest digits that read back as the same double, in
// positional notation from 1e-4 up to 1e16 and in exponent notation outside it.
std::string PythonFloat(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[40];
  int precision = 1;
  for (; precision < 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", precision - 1, x);
    if (std::strtod(buffer, nullptr) == x) break;
  }
  std::snprintf(buffer, sizeof(buffer), "%.*e", precision - 1, x);
  const std::string s(buffer);
  const size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  const bool negative = s[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (s[i] != '.') digits += s[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    absl::StrAppend(&out, "e", exponent < 0 ? "-" : "+", std::abs(exponent) < 10 ? "0" : "",
                    std::abs(exponent));
  } else if (exponent < 0) {
    out = absl::StrCat("0.", std::string(-exponent - 1, '0'), digits);
  } else {
    const size_t whole = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= whole) {
      out = absl::StrCat(digits, std::string(whole - digits.size(), '0'), ".0");
    } else {
      out = absl::StrCat(digits.substr(0, whole), ".", digits.substr(whole));
    }
  }
  return negative ? absl::StrCat("-", out) : out;
}

// Python's repr() of a str: single quotes unless the text holds one and no double quote.
std::string PythonStringRepr(const std::string& s) {
  const bool single = s.find('\'') != std::string::npos;
  const bool dbl = s.find('"') != std::string::npos;
  const char quote = single && !dbl ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", u);
      out += hex;
    } else {
      out += c;  // bytes of UTF-8 as they are: Python prints printable characters unescaped
    }
  }
  out += quote;
  return out;
}

std::string Repr(const Json& v);

// Python's str(): what Jinja writes for a value in a template's text.
std::string Text(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return v.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer:
      return absl::StrCat(v.get<int64_t>());
    case Json::value_t::number_unsigned:
      return absl::StrCat(v.get<uint64_t>());
    case Json::value_t::number_float:
      return PythonFloat(v.get<double>());
    case Json::value_t::string:
      return v.get<std::string>();
    case Json::value_t::array: {
      std::vector<std::string> items;
      for (const Json& item : v) items.push_back(Repr(item));
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
    case Json::value_t::object: {
      std::vector<std::string> items;
      for (auto it = v.begin(); it != v.end(); ++it) {
        items.push_back(absl::StrCat(PythonStringRepr(it.key()), ": ", Repr(it.value())));
      }
      return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
    }
    default:
      return "";
  }
}

// Python's repr(): as str() but for strings, quoted (the items of a rendered list).
std::string Repr(const Json& v) {
  return v.is_string() ? PythonStringRepr(v.get<std::string>()) : Text(v);
}

// The keys of a JSON object, for "its fields: ..." in errors.
std::string FieldList(const Json& object) {
  std::vector<std::string> keys;
  for (auto it = object.begin(); it != object.end(); ++it) keys.push_back(it.key());
  return keys.empty() ? "none" : absl::StrJoin(keys, ", ");
}

// Python's default whitespace for strip() and split() (ASCII).
constexpr char kWhitespace[] = " \t\n\r\v\f";

std::string StripChars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end && chars.find(s[begin]) != std::string::npos) ++begin;
  }
  if (right) {
    while (end > begin && chars.find(s[end - 1]) != std::string::npos) --end;
  }
  return s.substr(begin, end - begin);
}

// Python's list.index() and the position of a value among choices: Python's ==, under which
// 1 == 1.0 (nlohmann compares numbers across their types the same way).
std::optional<size_t> IndexOf(const Json& list, const Json& value) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == value && list[i].is_boolean() == value.is_boolean()) return i;
  }
  return std::nullopt;
}

// ---- Expressions ------------------------------------------------------------------------

enum class TokenType { kName, kNumber, kString, kPunct, kEnd };

struct Token {
  TokenType type;
  std::string text;  // the name, the punctuation, or the literal as written
  Json value;        // kNumber, kString
};

// Whether the expression's source continues at `pos` with the end of the {{ }} tag: "}}" or
// "-}}" (Jinja's whitespace control). Sets *length to the characters the end takes.
bool AtTagEnd(const std::string& src, size_t pos, size_t* length, bool* trim_after) {
  if (src.compare(pos, 2, "}}") == 0) {
    *length = 2;
    *trim_after = false;
    return true;
  }
  if (src.compare(pos, 3, "-}}") == 0 || src.compare(pos, 3, "+}}") == 0) {
    *length = 3;
    *trim_after = src[pos] == '-';
    return true;
  }
  return false;
}

// Splits the expression that starts at *pos of a template into tokens, up to the "}}" that ends
// it (outside string literals); *pos is left after that "}}". On error returns the problem.
std::string Lex(const std::string& src, size_t* pos, std::vector<Token>* tokens, bool* trim_after) {
  size_t i = *pos;
  while (true) {
    if (i >= src.size()) return "a {{ without its closing }}";
    const char c = src[i];
    size_t end_length = 0;
    if (AtTagEnd(src, i, &end_length, trim_after)) {
      *pos = i + end_length;
      tokens->push_back({TokenType::kEnd, "", nullptr});
      return "";
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
    } else if (absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() &&
             (absl::ascii_isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_')) {
        ++j;
      }
      tokens->push_back({TokenType::kName, src.substr(i, j - i), nullptr});
      i = j;
    } else if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < src.size() && absl::ascii_isdigit(static_cast<unsigned char>(src[j]))) ++j;
      bool is_float = false;
      if (j + 1 < src.size() && src[j] == '.' &&
          absl::ascii_isdigit(static_cast<unsigned char>(src[j + 1]))) {
        is_float = true;
        ++j;
        while (j < src.size() && absl::ascii_isdigit(static_cast<unsigned char>(src[j]))) ++j;
      }
      const std::string text = src.substr(i, j - i);
      Json value;
      if (is_float) {
        value = std::strtod(text.c_str(), nullptr);
      } else {
        int64_t n = 0;
        if (!absl::SimpleAtoi(text, &n)) return absl::StrCat("integer ", text, " is too large");
        value = n;
      }
      tokens->push_back({TokenType::kNumber, text, value});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < src.size() && src[j] != c; ++j) {
        if (src[j] != '\\' || j + 1 >= src.size()) {
          value += src[j];
          continue;
        }
        const char e = src[++j];
        switch (e) {
          case 'n':
            value += '\n';
            break;
          case 't':
            value += '\t';
            break;
          case 'r':
            value += '\r';
            break;
          case '\\':
          case '\'':
          case '"':
            value += e;
            break;
          default:  // Python keeps an unknown escape as written
            value += '\\';
            value += e;
        }
      }
      if (j >= src.size()) return "a string literal without its closing quote";
      tokens->push_back({TokenType::kString, src.substr(i, j + 1 - i), value});
      i = j + 1;
    } else {
      // Punctuation: the two-character operators first, so that they are refused by name.
      static const char* const kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
      std::string text(1, c);
      for (const char* two : kTwo) {
        if (src.compare(i, 2, two) == 0) text = two;
      }
      tokens->push_back({TokenType::kPunct, text, nullptr});
      i += text.size();
    }
  }
}

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kMember,
    kIndex,
    kSlice,
    kList,
    kAdd,
    kNegate,
    kMethod,
    kFilter
  };
  Kind kind;
  Json literal;      // kLiteral
  std::string name;  // kName, kMember, kMethod, kFilter
  // kMember: {object}; kIndex: {object, index}; kSlice: {object, start, stop} (null: omitted);
  // kList: the items; kAdd: {left, right}; kNegate: {operand}; kMethod and kFilter:
  // {object, arguments...}.
  std::vector<ExprPtr> operands;
};

struct Callable {
  const char* name;
  int min_args;
  int max_args;
};

// The methods and filters the harness's task files use in practice (choice_task.h).
constexpr Callable kMethods[] = {{"strip", 0, 1},   {"lstrip", 0, 1}, {"rstrip", 0, 1},
                                 {"lower", 0, 0},   {"upper", 0, 0},  {"split", 0, 1},
                                 {"replace", 2, 2}, {"index", 1, 1},  {"join", 1, 1}};
constexpr Callable kFilters[] = {{"trim", 0, 0}, {"lower", 0, 0}, {"upper", 0, 0},
                                 {"join", 0, 1}, {"first", 0, 0}, {"last", 0, 0}};

template <size_t N>
const Callable* FindCallable(const Callable (&table)[N], const std::string& name) {
  for (const Callable& c : table) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

template <size_t N>
std::string CallableNames(const Callable (&table)[N]) {
  std::vector<std::string> names;
  for (const Callable& c : table) names.emplace_back(c.name);
  return absl::StrJoin(names, ", ");
}

bool IsOperatorWord(const std::string& name) {
  static const auto* const words =
      new std::set<std::string>{"and", "or", "not", "in", "is", "if", "else"};
  return words->count(name) > 0;
}

// A recursive-descent parser over one expression's tokens:
//   additive := filtered ('+' filtered)*
//   filtered := unary ('|' NAME ['(' args ')'])*
//   unary    := '-' unary | postfix
//   postfix  := primary ('.' NAME ['(' args ')'] | '[' subscript ']')*
//   primary  := NAME | NUMBER | STRING | '[' [items] ']' | '(' additive ')'
// Methods and filters are checked by name and by their number of arguments here, so that a task
// file using one that is not supported is refused when it is read, not at its first document.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  // The expression, or nullptr with error() set.
  ExprPtr Parse() {
    ExprPtr e = Additive();
    if (e == nullptr) return nullptr;
    if (Peek().type != TokenType::kEnd) return Fail(Unexpected(Peek()));
    return e;
  }
  const std::string& error() const { return error_; }

 private:
  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& Next() { return tokens_[std::min(pos_++, tokens_.size() - 1)]; }
  bool IsPunct(const char* text, size_t ahead = 0) const {
    return Peek(ahead).type == TokenType::kPunct && Peek(ahead).text == text;
  }
  bool Accept(const char* text) {
    if (!IsPunct(text)) return false;
    ++pos_;
    return true;
  }
  ExprPtr Fail(const std::string& what) {
    if (error_.empty()) error_ = what;
    return nullptr;
  }

  static std::string Unexpected(const Token& t) {
    static const auto* const operators = new std::set<std::string>{
        "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "!", "="};
    if (t.type == TokenType::kEnd) return "the expression ends too early";
    if ((t.type == TokenType::kPunct && operators->count(t.text) > 0) ||
        (t.type == TokenType::kName && IsOperatorWord(t.text))) {
      return absl::StrCat("operator '", t.text,
                          "' is not supported (the operators: + of strings and lists, a.b, "
                          "a[i], a[i:j], | filters)");
    }
    if (t.type == TokenType::kPunct && t.text == "{") return "dict literals are not supported";
    return absl::StrCat("unexpected '", t.text, "'");
  }

  static ExprPtr Make(Expr::Kind kind, std::vector<ExprPtr> operands, std::string name = "",
                      Json literal = nullptr) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->operands = std::move(operands);
    e->name = std::move(name);
    e->literal = std::move(literal);
    return e;
  }

  ExprPtr Additive() {
    ExprPtr left = Filtered();
    if (left == nullptr) return nullptr;
    while (Accept("+")) {
      ExprPtr right = Filtered();
      if (right == nullptr) return nullptr;
      left = Make(Expr::Kind::kAdd, {left, right});
    }
    return left;
  }

  ExprPtr Filtered() {
    ExprPtr e = Unary();
    if (e == nullptr) return nullptr;
    while (Accept("|")) {
      if (Peek().type != TokenType::kName) return Fail("expected a filter's name after '|'");
      const std::string name = Next().text;
      const Callable* filter = FindCallable(kFilters, name);
      if (filter == nullptr) {
        return Fail(absl::StrCat(
            "filter '", name, "' is not supported (the filters: ", CallableNames(kFilters), ")"));
      }
      std::vector<ExprPtr> operands = {e};
      if (Accept("(") && !Arguments(&operands)) return nullptr;
      if (!CheckArity(*filter, "filter", operands.size() - 1)) return nullptr;
      e = Make(Expr::Kind::kFilter, std::move(operands), name);
    }
    return e;
  }

  ExprPtr Unary() {
    if (Accept("-")) {
      ExprPtr operand = Unary();
      if (operand == nullptr) return nullptr;
      return Make(Expr::Kind::kNegate, {operand});
    }
    return Postfix();
  }

  ExprPtr Postfix() {
    ExprPtr e = Primary();
    if (e == nullptr) return nullptr;
    while (true) {
      if (Accept(".")) {
        if (Peek().type != TokenType::kName) return Fail("expected a name after '.'");
        const std::string name = Next().text;
        if (!Accept("(")) {
          e = Make(Expr::Kind::kMember, {e}, name);
          continue;
        }
        const Callable* method = FindCallable(kMethods, name);
        if (method == nullptr) {
          return Fail(absl::StrCat(
              "method '", name, "' is not supported (the methods: ", CallableNames(kMethods), ")"));
        }
        std::vector<ExprPtr> operands = {e};
        if (!Arguments(&operands)) return nullptr;
        if (!CheckArity(*method, "method", operands.size() - 1)) return nullptr;
        e = Make(Expr::Kind::kMethod, std::move(operands), name);
      } else if (Accept("[")) {
        ExprPtr start;
        if (!IsPunct(":")) {
          start = Additive();
          if (start == nullptr) return nullptr;
        }
        if (Accept(":")) {
          ExprPtr stop;
          if (!IsPunct("]") && !IsPunct(":")) {
            stop = Additive();
            if (stop == nullptr) return nullptr;
          }
          if (IsPunct(":")) return Fail("slice steps (a[i:j:k]) are not supported");
          e = Make(Expr::Kind::kSlice, {e, start, stop});
        } else {
          e = Make(Expr::Kind::kIndex, {e, start});
        }
        if (!Accept("]")) return Fail(absl::StrCat("expected ']', got ", Describe(Peek())));
      } else if (IsPunct("(")) {
        return Fail(absl::StrCat(
            e->kind == Expr::Kind::kName ? absl::StrCat("function '", e->name, "'") : "a call",
            " is not supported: only the methods ", CallableNames(kMethods), " can be called"));
      } else {
        return e;
      }
    }
  }

  ExprPtr Primary() {
    const Token& t = Peek();
    switch (t.type) {
      case TokenType::kNumber:
      case TokenType::kString:
        ++pos_;
        return Make(Expr::Kind::kLiteral, {}, "", t.value);
      case TokenType::kName: {
        if (IsOperatorWord(t.text)) return Fail(Unexpected(t));
        ++pos_;
        if (t.text == "true" || t.text == "True") return Make(Expr::Kind::kLiteral, {}, "", true);
        if (t.text == "false" || t.text == "False") {
          return Make(Expr::Kind::kLiteral, {}, "", false);
        }
        if (t.text == "none" || t.text == "None") return Make(Expr::Kind::kLiteral, {});
        return Make(Expr::Kind::kName, {}, t.text);
      }
      case TokenType::kPunct:
        if (Accept("[")) {
          std::vector<ExprPtr> items;
          while (!Accept("]")) {
            ExprPtr item = Additive();
            if (item == nullptr) return nullptr;
            items.push_back(item);
            if (!Accept(",") && !IsPunct("]")) {
              return Fail(absl::StrCat("expected ',' or ']' in a list, got ", Describe(Peek())));
            }
          }
          return Make(Expr::Kind::kList, std::move(items));
        }
        if (Accept("(")) {
          ExprPtr e = Additive();
          if (e == nullptr) return nullptr;
          if (IsPunct(",")) return Fail("tuples are not supported (write a list: [a, b])");
          if (!Accept(")")) return Fail(absl::StrCat("expected ')', got ", Describe(Peek())));
          return e;
        }
        return Fail(Unexpected(t));
      case TokenType::kEnd:
        return Fail(Unexpected(t));
    }
    return Fail(Unexpected(t));
  }

  // The arguments of a call whose '(' has been read, through its ')'.
  bool Arguments(std::vector<ExprPtr>* operands) {
    while (!Accept(")")) {
      if (Peek().type == TokenType::kName && IsPunct("=", 1)) {
        Fail(absl::StrCat("keyword arguments (", Peek().text, "=...) are not supported"));
        return false;
      }
      ExprPtr arg = Additive();
      if (arg == nullptr) return false;
      operands->push_back(arg);
      if (!Accept(",") && !IsPunct(")")) {
        Fail(absl::StrCat("expected ',' or ')' in the arguments, got ", Describe(Peek())));
        return false;
      }
    }
    return true;
  }

  bool CheckArity(const Callable& c, const char* what, size_t given) {
    if (static_cast<int>(given) >= c.min_args && static_cast<int>(given) <= c.max_args) {
      return true;
    }
    const std::string wanted = c.min_args == c.max_args
                                   ? absl::StrCat(c.min_args)
                                   : absl::StrCat(c.min_args, " or ", c.max_args);
    Fail(absl::StrCat(what, " ", c.name, " takes ", wanted, " argument",
                      c.max_args == 1 && c.min_args == 1 ? "" : "s", ", got ", given));
    return false;
  }

  static std::string Describe(const Token& t) {
    return t.type == TokenType::kEnd ? "the end" : absl::StrCat("'", t.text, "'");
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::string error_;
};

using Eval = absl::StatusOr<Json>;

absl::Status Error(const std::string& what) { return absl::InvalidArgumentError(what); }

// Python's index into a sequence of `size`: negative from the end; nullopt when out of range.
std::optional<size_t> SequenceIndex(int64_t i, size_t size) {
  const int64_t n = static_cast<int64_t>(size);
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  return static_cast<size_t>(i);
}

// Python's bound of a slice, clamped to [0, size].
size_t SliceBound(const Json& bound, size_t size, size_t if_omitted) {
  if (bound.is_null()) return if_omitted;
  const int64_t n = static_cast<int64_t>(size);
  int64_t i = bound.get<int64_t>();
  if (i < 0) i += n;
  return static_cast<size_t>(std::clamp<int64_t>(i, 0, n));
}

Eval Evaluate(const Expr& e, const Json& doc);

Eval Member(const Json& object, const std::string& name) {
  if (!object.is_object()) return Error(absl::StrCat(AType(object), " has no field '", name, "'"));
  auto it = object.find(name);
  if (it == object.end()) {
    return Error(absl::StrCat("no field '", name, "' (the fields there: ", FieldList(object), ")"));
  }
  return *it;
}

Eval Index(const Json& object, const Json& index) {
  if (object.is_object()) {
    if (!index.is_string()) {
      return Error(absl::StrCat("a dict's fields are named by str, not ", TypeName(index)));
    }
    return Member(object, index.get<std::string>());
  }
  if (!object.is_array() && !object.is_string()) {
    return Error(absl::StrCat(AType(object), " cannot be indexed"));
  }
  if (!IsInt(index)) {
    return Error(absl::StrCat(AType(object), " is indexed by int, not ", TypeName(index)));
  }
  const size_t size =
      object.is_array() ? object.size() : object.get_ref<const std::string&>().size();
  const std::optional<size_t> i = SequenceIndex(index.get<int64_t>(), size);
  if (!i) {
    return Error(absl::StrCat("index ", index.get<int64_t>(), " is out of range for a ",
                              TypeName(object), " of ", size));
  }
  if (object.is_array()) return object[*i];
  return std::string(1, object.get_ref<const std::string&>()[*i]);
}

Eval Slice(const Json& object, const Json& start, const Json& stop) {
  for (const Json* bound : {&start, &stop}) {
    if (!bound->is_null() && !IsInt(*bound)) {
      return Error(absl::StrCat("slice bounds are int, not ", TypeName(*bound)));
    }
  }
  if (object.is_array()) {
    const size_t from = SliceBound(start, object.size(), 0);
    const size_t to = SliceBound(stop, object.size(), object.size());
    Json out = Json::array();
    for (size_t i = from; i < to; ++i) out.push_back(object[i]);
    return out;
  }
  if (object.is_string()) {
    const std::string& s = object.get_ref<const std::string&>();
    const size_t from = SliceBound(start, s.size(), 0);
    const size_t to = SliceBound(stop, s.size(), s.size());
    return to > from ? s.substr(from, to - from) : std::string();
  }
  return Error(absl::StrCat(AType(object), " cannot be sliced"));
}

Eval Add(const Json& a, const Json& b) {
  if (a.is_string() && b.is_string()) return a.get<std::string>() + b.get<std::string>();
  if (a.is_array() && b.is_array()) {
    Json out = a;
    for (const Json& item : b) out.push_back(item);
    return out;
  }
  if (IsNumber(a) && IsNumber(b)) {
    if (IsInt(a) && IsInt(b)) return a.get<int64_t>() + b.get<int64_t>();
    return a.get<double>() + b.get<double>();
  }
  return Error(absl::StrCat("cannot add ", AType(a), " and ", AType(b)));
}

absl::StatusOr<std::string> StringArgument(const Json& v, const std::string& method) {
  if (!v.is_string()) {
    return Error(absl::StrCat(method, "() takes str arguments, got ", AType(v)));
  }
  return v.get<std::string>();
}

std::vector<std::string> SplitWhitespace(const std::string& s) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (true) {
    while (i < s.size() && std::strchr(kWhitespace, s[i]) != nullptr) ++i;
    if (i >= s.size()) return parts;
    size_t j = i;
    while (j < s.size() && std::strchr(kWhitespace, s[j]) == nullptr) ++j;
    parts.push_back(s.substr(i, j - i));
    i = j;
  }
}

Eval Method(const std::string& name, const Json& object, const std::vector<Json>& args) {
  if (name == "index" && object.is_array()) {
    const std::optional<size_t> i = IndexOf(object, args[0]);
    if (!i) {
      return Error(absl::StrCat(Repr(args[0]), " is not in the list ", Text(object)));
    }
    return static_cast<int64_t>(*i);
  }
  if (!object.is_string()) {
    return Error(absl::StrCat(AType(object), " has no method ", name, "()"));
  }
  const std::string& s = object.get_ref<const std::string&>();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    std::string chars = kWhitespace;
    if (!args.empty() && !args[0].is_null()) {
      absl::StatusOr<std::string> given = StringArgument(args[0], name);
      if (!given.ok()) return given.status();
      chars = *given;
    }
    return StripChars(s, chars, name != "rstrip", name != "lstrip");
  }
  if (name == "lower") return absl::AsciiStrToLower(s);
  if (name == "upper") return absl::AsciiStrToUpper(s);
  if (name == "split") {
    Json out = Json::array();
    if (args.empty() || args[0].is_null()) {
      for (std::string& part : SplitWhitespace(s)) out.push_back(std::move(part));
      return out;
    }
    absl::StatusOr<std::string> sep = StringArgument(args[0], name);
    if (!sep.ok()) return sep.status();
    if (sep->empty()) return Error("split(): empty separator");
    size_t from = 0;
    while (true) {
      const size_t at = s.find(*sep, from);
      if (at == std::string::npos) break;
      out.push_back(s.substr(from, at - from));
      from = at + sep->size();
    }
    out.push_back(s.substr(from));
    return out;
  }
  if (name == "replace") {
    absl::StatusOr<std::string> old_text = StringArgument(args[0], name);
    if (!old_text.ok()) return old_text.status();
    absl::StatusOr<std::string> new_text = StringArgument(args[1], name);
    if (!new_text.ok()) return new_text.status();
    if (old_text->empty()) {  // Python puts the new text between every two characters
      std::string out = *new_text;
      for (const char c : s) {
        out += c;
        out += *new_text;
      }
      return out;
    }
    std::string out;
    size_t from = 0;
    while (true) {
      const size_t at = s.find(*old_text, from);
      if (at == std::string::npos) break;
      absl::StrAppend(&out, s.substr(from, at - from), *new_text);
      from = at + old_text->size();
    }
    out += s.substr(from);
    return out;
  }
  if (name == "index") {
    absl::StatusOr<std::string> sub = StringArgument(args[0], name);
    if (!sub.ok()) return sub.status();
    const size_t at = s.find(*sub);
    if (at == std::string::npos) {
      return Error(absl::StrCat("substring ", PythonStringRepr(*sub), " not found in ",
                                PythonStringRepr(s)));
    }
    return static_cast<int64_t>(at);
  }
  if (name == "join") {
    if (!args[0].is_array()) {
      return Error(absl::StrCat("join() takes a list, got ", AType(args[0])));
    }
    std::vector<std::string> items;
    for (size_t i = 0; i < args[0].size(); ++i) {
      if (!args[0][i].is_string()) {
        return Error(absl::StrCat("join(): item ", i, " is ", AType(args[0][i]), ", not a str"));
      }
      items.push_back(args[0][i].get<std::string>());
    }
    return absl::StrJoin(items, s);
  }
  return Error(absl::StrCat("a str has no method ", name, "()"));
}

Eval Filter(const std::string& name, const Json& value, const std::vector<Json>& args) {
  if (name == "trim") return StripChars(Text(value), kWhitespace, true, true);
  if (name == "lower") return absl::AsciiStrToLower(Text(value));
  if (name == "upper") return absl::AsciiStrToUpper(Text(value));
  if (name == "join") {
    const std::string sep = args.empty() ? "" : Text(args[0]);
    std::vector<std::string> items;
    if (value.is_string()) {
      for (const char c : value.get_ref<const std::string&>()) items.emplace_back(1, c);
    } else if (value.is_array()) {
      for (const Json& item : value) items.push_back(Text(item));
    } else {
      return Error(absl::StrCat("| join takes a list, got ", AType(value)));
    }
    return absl::StrJoin(items, sep);
  }
  if (name == "first" || name == "last") {
    const bool first = name == "first";
    if (value.is_array()) {
      if (value.empty()) return Error(absl::StrCat("| ", name, " of an empty list"));
      return first ? value.front() : value.back();
    }
    if (value.is_string()) {
      const std::string& s = value.get_ref<const std::string&>();
      if (s.empty()) return Error(absl::StrCat("| ", name, " of an empty str"));
      return std::string(1, first ? s.front() : s.back());
    }
    return Error(absl::StrCat("| ", name, " takes a list or a str, got ", AType(value)));
  }
  return Error(absl::StrCat("filter ", name, " is not supported"));
}

Eval Evaluate(const Expr& e, const Json& doc) {
  std::vector<Json> values;
  for (const ExprPtr& operand : e.operands) {
    if (operand == nullptr) {
      values.emplace_back(nullptr);  // an omitted slice bound
      continue;
    }
    Eval v = Evaluate(*operand, doc);
    if (!v.ok()) return v;
    values.push_back(*std::move(v));
  }
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName: {
      auto it = doc.find(e.name);
      if (it == doc.end()) {
        return Error(absl::StrCat("'", e.name,
                                  "' is undefined (the document's fields: ", FieldList(doc), ")"));
      }
      return *it;
    }
    case Expr::Kind::kMember:
      return Member(values[0], e.name);
    case Expr::Kind::kIndex:
      return Index(values[0], values[1]);
    case Expr::Kind::kSlice:
      return Slice(values[0], values[1], values[2]);
    case Expr::Kind::kList:
      return Json(values);
    case Expr::Kind::kAdd:
      return Add(values[0], values[1]);
    case Expr::Kind::kNegate:
      if (IsInt(values[0])) return -values[0].get<int64_t>();
      if (IsNumber(values[0])) return -values[0].get<double>();
      return Error(absl::StrCat("cannot negate ", AType(values[0])));
    case Expr::Kind::kMethod:
      return Method(e.name, values[0], std::vector<Json>(values.begin() + 1, values.end()));
    case Expr::Kind::kFilter:
      return Filter(e.name, values[0], std::vector<Json>(values.begin() + 1, values.end()));
  }
  return Error("unknown expression");
}

// ---- Templates ----------------------------------------------------------------------------

struct TemplatePart {
  std::string text;  // when expr is null
  ExprPtr expr;
  std::string source;  // the {{ ... }} as written, for errors
};

// One template of the task file: a doc_to_* value, an item of a doc_to_choice list, or the
// description.
struct Template {
  std::string source;
  std::string field;  // "doc_to_text", "doc_to_choice[1]", ... (errors)
  std::string file;   // where it is written (errors)
  int line = 0;
  // The harness's first rule for doc_to_text, doc_to_choice and doc_to_target strings: one that
  // is the name of a document field is that field's value, not a template.
  bool may_name_field = false;
  std::vector<TemplatePart> parts;
  bool single = false;  // one {{ expression }} and nothing but whitespace around it
};

absl::StatusOr<Template> CompileTemplate(const std::string& source, const std::string& field,
                                         const std::string& file, int line, bool may_name_field) {
  Template t;
  t.source = source;
  t.field = field;
  t.file = file;
  t.line = line;
  t.may_name_field = may_name_field;
  auto problem = [&](const std::string& what) {
    return absl::InvalidArgumentError(YamlProblem(file, line, field, what));
  };
  std::string text;
  bool trim_next = false;
  size_t i = 0;
  while (i < source.size()) {
    const size_t open = source.find('{', i);
    const bool tag =
        open != std::string::npos && open + 1 < source.size() &&
        (source[open + 1] == '{' || source[open + 1] == '%' || source[open + 1] == '#');
    if (!tag) {
      const size_t end = open == std::string::npos ? source.size() : open + 1;
      text += source.substr(i, end - i);
      i = end;
      continue;
    }
    text += source.substr(i, open - i);
    if (source[open + 1] == '%') {
      return problem(
          "{% statements %} are not supported (only {{ expressions }}): compute the value into "
          "the data file's documents instead");
    }
    if (source[open + 1] == '#') return problem("{# comments #} are not supported");
    size_t pos = open + 2;
    const bool trim_before = pos < source.size() && source[pos] == '-';
    if (pos < source.size() && (source[pos] == '-' || source[pos] == '+')) ++pos;
    std::vector<Token> tokens;
    bool trim_after = false;
    const std::string lex_error = Lex(source, &pos, &tokens, &trim_after);
    const std::string expr_source =
        lex_error.empty() ? source.substr(open, pos - open) : source.substr(open);
    if (!lex_error.empty()) return problem(absl::StrCat(expr_source, ": ", lex_error));
    Parser parser(std::move(tokens));
    ExprPtr expr = parser.Parse();
    if (expr == nullptr) return problem(absl::StrCat(expr_source, ": ", parser.error()));
    if (trim_next) text = StripChars(text, kWhitespace, true, false);
    if (trim_before) text = StripChars(text, kWhitespace, false, true);
    if (!text.empty()) t.parts.push_back({text, nullptr, ""});
    text.clear();
    t.parts.push_back({"", expr, expr_source});
    trim_next = trim_after;
    i = pos;
  }
  if (trim_next) text = StripChars(text, kWhitespace, true, false);
  if (!text.empty()) t.parts.push_back({text, nullptr, ""});
  int exprs = 0;
  bool blank_text = true;
  for (const TemplatePart& p : t.parts) {
    if (p.expr != nullptr) {
      ++exprs;
    } else if (p.text.find_first_not_of(kWhitespace) != std::string::npos) {
      blank_text = false;
    }
  }
  t.single = exprs == 1 && blank_text;
  return t;
}

// A template applied to a document: a field's value (may_name_field), the one expression's
// value (single), or the rendered text. An error is "{{ expr }}: what".
Eval Apply(const Template& t, const Json& doc) {
  if (t.may_name_field) {
    auto it = doc.find(t.source);
    if (it != doc.end()) return *it;
  }
  if (t.single) {
    for (const TemplatePart& p : t.parts) {
      if (p.expr == nullptr) continue;
      Eval v = Evaluate(*p.expr, doc);
      if (!v.ok()) return Error(absl::StrCat(p.source, ": ", v.status().message()));
      return v;
    }
  }
  std::string out;
  for (const TemplatePart& p : t.parts) {
    if (p.expr == nullptr) {
      out += p.text;
      continue;
    }
    Eval v = Evaluate(*p.expr, doc);
    if (!v.ok()) return Error(absl::StrCat(p.source, ": ", v.status().message()));
    out += Text(*v);
  }
  return out;
}

// ---- The task file ------------------------------------------------------------------------

// The keys read, and those that do not change what is scored (accepted, ignored).
const std::set<std::string>& ReadKeys() {
  static const auto* const keys = new std::set<std::string>{
      "task",           "include",          "output_type",   "dataset_path",
      "dataset_name",   "dataset_kwargs",   "test_split",    "validation_split",
      "training_split", "doc_to_text",      "doc_to_choice", "doc_to_target",
      "description",    "target_delimiter", "num_fewshot",   "metric_list"};
  return *keys;
}
const std::set<std::string>& IgnoredKeys() {
  static const auto* const keys = new std::set<std::string>{"tag",
                                                            "group",
                                                            "metadata",
                                                            "should_decontaminate",
                                                            "doc_to_decontamination_query",
                                                            "fewshot_delimiter",
                                                            "fewshot_split",
                                                            "fewshot_config"};
  return *keys;
}
// The harness keys refused, each with why.
const std::map<std::string, std::string>& RefusedKeys() {
  static const auto* const keys = new std::map<std::string, std::string>{
      {"process_docs",
       "not supported: it runs Python over the documents — write the processed documents into "
       "the data files instead"},
      {"process_results",
       "not supported: it runs Python over the scores — multiple_choice scores acc, acc_norm "
       "and the log-probability itself"},
      {"filter_list",
       "not supported: filters post-process generated answers, and multiple_choice generates "
       "none"},
      {"generation_kwargs",
       "not supported: multiple_choice scores the choices' log-probabilities and generates "
       "nothing"},
  };
  return *keys;
}

constexpr int kMaxIncludeDepth = 8;

// A top-level key of the merged task file: where it is written (its key's line: yaml-cpp gives
// a null value the position of the next node) and its value.
struct Entry {
  std::string file;
  int line = 0;
  YAML::Node value;
};
using Keys = std::map<std::string, Entry>;

absl::Status Problem(const std::string& file, int line, const std::string& field,
                     const std::string& what) {
  return absl::InvalidArgumentError(YamlProblem(file, line, field, what));
}
absl::Status Problem(const Entry& e, const std::string& field, const std::string& what) {
  return Problem(e.file, e.line, field, what);
}

// The first node below `node` tagged !function (the harness imports a Python function there),
// with its dotted path from `path`.
bool FindFunctionTag(const YAML::Node& node, const std::string& path, YAML::Node* found,
                     std::string* found_path) {
  if (node.Tag() == "!function") {
    found->reset(node);  // rebinds: operator= would write into the node `found` refers to
    *found_path = path;
    return true;
  }
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (FindFunctionTag(it->second, absl::StrCat(path, ".", it->first.Scalar()), found,
                          found_path)) {
        return true;
      }
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      if (FindFunctionTag(node[i], absl::StrCat(path, "[", i, "]"), found, found_path)) {
        return true;
      }
    }
  }
  return false;
}

// The keys of one file, each checked: known, given once, no !function.
absl::StatusOr<Keys> FileKeys(const YAML::Node& root, const std::string& file) {
  Keys keys;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const YAML::Node key = it->first;
    const int line = YamlLine(key);
    if (!key.IsScalar()) return Problem(file, line, "", "a key must be a name");
    const std::string name = key.Scalar();
    if (keys.count(name) > 0) {
      return Problem(file, line, name,
                     absl::StrCat("given twice (first at line ", keys[name].line, ")"));
    }
    auto refused = RefusedKeys().find(name);
    if (refused != RefusedKeys().end()) return Problem(file, line, name, refused->second);
    if (ReadKeys().count(name) == 0 && IgnoredKeys().count(name) == 0) {
      std::vector<std::string> known(ReadKeys().begin(), ReadKeys().end());
      known.insert(known.end(), IgnoredKeys().begin(), IgnoredKeys().end());
      const std::string closest = ClosestName(name, known);
      return Problem(
          file, line, name,
          absl::StrCat("unknown or unsupported key",
                       closest.empty() ? "" : absl::StrCat(" (did you mean ", closest, "?)"),
                       " — config/choice_task.h lists the keys read"));
    }
    YAML::Node function;
    std::string function_path;
    if (FindFunctionTag(it->second, name, &function, &function_path)) {
      const int at = YamlLine(function) > 0 ? YamlLine(function) : line;
      return Problem(file, at, function_path,
                     absl::StrCat("!function ", function.IsScalar() ? function.Scalar() : "",
                                  ": Python functions are not supported — put the values into "
                                  "the data file's documents, or use a {{ template }}"));
    }
    keys.emplace(name, Entry{file, line, it->second});
  }
  return keys;
}

// Reads `path` and, first, the file it includes (recursively): the keys, base first and this
// file's over them; the contents of every file read, this one first (the fingerprint's order).
// `stack` holds the files being read, for cycles.
absl::Status ReadTaskTree(const std::string& path, std::vector<std::string>* stack,
                          std::vector<std::string>* texts, Keys* keys) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  texts->push_back(*text);
  absl::StatusOr<YAML::Node> root = ParseYaml(*text, path);
  if (!root.ok()) return root.status();
  if (!root->IsMap()) {
    return Problem(path, YamlLine(*root), "",
                   "a task file is a mapping of keys (task:, dataset_path:, doc_to_text: ...)");
  }
  absl::StatusOr<Keys> mine = FileKeys(*root, path);
  if (!mine.ok()) return mine.status();
  auto include = mine->find("include");
  if (include != mine->end()) {
    const Entry& e = include->second;
    if (!e.value.IsScalar() || e.value.Scalar().empty()) {
      return Problem(e, "include", "expected the path of one task file");
    }
    fs::path base = e.value.Scalar();
    if (base.is_relative()) base = fs::path(path).parent_path() / base;
    std::error_code error;
    const std::string canonical = fs::weakly_canonical(base, error).string();
    if (std::find(stack->begin(), stack->end(), canonical) != stack->end()) {
      return Problem(e, "include",
                     absl::StrCat(base.string(), " is already being read: an include cycle"));
    }
    if (static_cast<int>(stack->size()) > kMaxIncludeDepth) {
      return Problem(e, "include",
                     absl::StrCat("more than ", kMaxIncludeDepth, " levels of include"));
    }
    stack->push_back(canonical);
    absl::Status s = ReadTaskTree(base.string(), stack, texts, keys);
    stack->pop_back();
    if (!s.ok()) {
      // A base that is not there: say which include names it.
      if (absl::IsNotFound(s)) {
        return absl::NotFoundError(
            YamlProblem(e.file, e.line, "include", std::string(s.message())));
      }
      return s;
    }
  }
  for (auto& [name, entry] : *mine) {
    if (name == "include") continue;
    // erase + emplace, not assignment: a YAML::Node's operator= writes through to the node it
    // refers to (the base file's value), where this file's value must replace it.
    keys->erase(name);
    keys->emplace(name, entry);
  }
  return absl::OkStatus();
}

const Entry* Find(const Keys& keys, const std::string& name) {
  auto it = keys.find(name);
  return it == keys.end() ? nullptr : &it->second;
}

// A scalar key's text; nullopt when absent or null.
absl::StatusOr<std::optional<std::string>> OptionalScalar(const Keys& keys,
                                                          const std::string& name) {
  const Entry* e = Find(keys, name);
  if (e == nullptr || e->value.IsNull()) return std::optional<std::string>();
  if (!e->value.IsScalar()) {
    return Problem(
        *e, name,
        absl::StrCat("expected a string, got a ", e->value.IsSequence() ? "list" : "mapping"));
  }
  return std::optional<std::string>(e->value.Scalar());
}

// How a document becomes an item, compiled from the task file.
struct Spec {
  std::optional<Template> description;
  Template text;
  std::optional<Template> choice;       // doc_to_choice as a string
  std::vector<Template> choice_list;    // doc_to_choice as a YAML list
  std::optional<Template> target;       // doc_to_target as a string
  std::optional<int64_t> target_index;  // doc_to_target as a YAML integer
};

// The split's data files from dataset_kwargs.data_files.
absl::StatusOr<std::vector<std::string>> DataFiles(const Keys& keys, const std::string& split,
                                                   const std::string& split_key,
                                                   const std::string& task_file, int root_line) {
  const Entry* kwargs = Find(keys, "dataset_kwargs");
  if (kwargs == nullptr || kwargs->value.IsNull()) {
    return Problem(task_file, root_line, "dataset_kwargs",
                   "missing: dataset_path: json reads the files of dataset_kwargs.data_files");
  }
  if (!kwargs->value.IsMap()) return Problem(*kwargs, "dataset_kwargs", "expected a mapping");
  YAML::Node files;
  for (auto it = kwargs->value.begin(); it != kwargs->value.end(); ++it) {
    const std::string name = it->first.Scalar();
    if (name != "data_files") {
      return Problem(kwargs->file, YamlLine(it->first) > 0 ? YamlLine(it->first) : kwargs->line,
                     absl::StrCat("dataset_kwargs.", name),
                     "not supported: dataset_kwargs gives data_files only");
    }
    files.reset(it->second);
  }
  const std::string field = "dataset_kwargs.data_files";
  const int line = YamlLine(files) > 0 ? YamlLine(files) : kwargs->line;
  if (!files.IsDefined() || files.IsNull()) {
    return Problem(kwargs->file, kwargs->line, field, "missing: the JSON files of the documents");
  }
  auto names = [&](const YAML::Node& node, std::vector<std::string>* out) -> absl::Status {
    if (node.IsScalar()) {
      out->push_back(node.Scalar());
    } else if (node.IsSequence()) {
      for (size_t i = 0; i < node.size(); ++i) {
        if (!node[i].IsScalar()) {
          return Problem(kwargs->file, line, field, "expected a file name or a list of them");
        }
        out->push_back(node[i].Scalar());
      }
    } else {
      return Problem(kwargs->file, line, field, "expected a file name or a list of them");
    }
    return absl::OkStatus();
  };
  std::vector<std::string> given;
  if (files.IsMap()) {
    std::vector<std::string> splits;
    YAML::Node chosen;
    bool found = false;
    for (auto it = files.begin(); it != files.end(); ++it) {
      splits.push_back(it->first.Scalar());
      if (it->first.Scalar() == split) {
        chosen.reset(it->second);
        found = true;
      }
    }
    if (!found) {
      return Problem(
          kwargs->file, line, field,
          absl::StrCat("no split '", split, "' (the ", split_key,
                       " evaluated), and the splits given are: ", absl::StrJoin(splits, ", ")));
    }
    if (absl::Status s = names(chosen, &given); !s.ok()) return s;
  } else {
    // A file or a list of files with no split names: Hugging Face's `datasets` calls them the
    // split "train", and a task file evaluating "test" would find nothing there. They are taken
    // as the evaluated split whatever its name: a local file is written to be evaluated.
    if (absl::Status s = names(files, &given); !s.ok()) return s;
  }
  if (given.empty()) return Problem(kwargs->file, line, field, "no files given");
  // Relative to the task file evaluated, not to a base it includes (config/choice_task.h).
  const fs::path dir = fs::path(task_file).parent_path();
  std::vector<std::string> resolved;
  for (const std::string& f : given) {
    const fs::path p(f);
    resolved.push_back(p.is_absolute() || dir.empty() ? p.string() : (dir / p).string());
  }
  return resolved;
}

// Checks the keys that must have one value (output_type, dataset_path, num_fewshot, metric_list)
// and the splits' types.
absl::Status CheckSettings(const Keys& keys, const std::string& task_file, int root_line) {
  // An absent output_type is taken as multiple_choice: the harness's default is generate_until,
  // but the run's `task: multiple_choice` already says how the file is scored.
  absl::StatusOr<std::optional<std::string>> output_type = OptionalScalar(keys, "output_type");
  if (!output_type.ok()) return output_type.status();
  if (*output_type && **output_type != kMultipleChoiceTask) {
    return Problem(*Find(keys, "output_type"), "output_type",
                   absl::StrCat(**output_type,
                                " is not supported: only multiple_choice (each choice scored by "
                                "its log-probability after the context)"));
  }
  absl::StatusOr<std::optional<std::string>> path = OptionalScalar(keys, "dataset_path");
  if (!path.ok()) return path.status();
  if (!*path) {
    return Problem(task_file, root_line, "dataset_path",
                   "missing: dataset_path: json, with dataset_kwargs.data_files");
  }
  if (**path != "json") {
    return Problem(*Find(keys, "dataset_path"), "dataset_path",
                   absl::StrCat(**path,
                                " is not supported: only json, with local files in "
                                "dataset_kwargs.data_files (nothing is downloaded)"));
  }
  if (const Entry* e = Find(keys, "dataset_name"); e != nullptr && !e->value.IsNull()) {
    return Problem(*e, "dataset_name", "must be null: a json dataset has no configurations");
  }
  for (const char* split : {"test_split", "validation_split", "training_split"}) {
    absl::StatusOr<std::optional<std::string>> s = OptionalScalar(keys, split);
    if (!s.ok()) return s.status();
  }
  if (const Entry* e = Find(keys, "num_fewshot"); e != nullptr && !e->value.IsNull()) {
    int64_t shots = -1;
    if (!e->value.IsScalar() || !absl::SimpleAtoi(e->value.Scalar(), &shots) || shots != 0) {
      return Problem(*e, "num_fewshot",
                     absl::StrCat(e->value.IsScalar() ? e->value.Scalar() : "a non-integer",
                                  ": only 0 is supported (zero-shot: no examples before the "
                                  "context)"));
    }
  }
  if (const Entry* e = Find(keys, "metric_list"); e != nullptr && !e->value.IsNull()) {
    if (!e->value.IsSequence()) return Problem(*e, "metric_list", "expected a list");
    for (size_t i = 0; i < e->value.size(); ++i) {
      const YAML::Node m = e->value[i];
      const std::string at = absl::StrCat("metric_list[", i, "]");
      const int line = YamlLine(m) > 0 ? YamlLine(m) : e->line;
      if (!m.IsMap()) return Problem(e->file, line, at, "expected a mapping with metric:");
      bool has_metric = false;
      for (auto it = m.begin(); it != m.end(); ++it) {
        const std::string key = it->first.Scalar();
        const std::string value = it->second.IsScalar() ? it->second.Scalar() : "";
        const std::string field = absl::StrCat(at, ".", key);
        const int key_line = YamlLine(it->first) > 0 ? YamlLine(it->first) : line;
        if (key == "metric") {
          has_metric = true;
          if (value != "acc" && value != "acc_norm") {
            return Problem(e->file, key_line, field,
                           absl::StrCat(value.empty() ? "this metric" : value,
                                        " is not supported: multiple_choice scores acc and "
                                        "acc_norm (and the log-probability)"));
          }
        } else if (key == "aggregation") {
          if (value != "mean") {
            return Problem(e->file, key_line, field, "only mean is supported");
          }
        } else if (key == "higher_is_better") {
          if (value != "true" && value != "True") {
            return Problem(e->file, key_line, field, "only true is supported (accuracy)");
          }
        } else {
          return Problem(e->file, key_line, field,
                         "not supported: a metric gives metric, aggregation and "
                         "higher_is_better");
        }
      }
      if (!has_metric) return Problem(e->file, line, at, "missing metric:");
    }
  }
  return absl::OkStatus();
}

// A template-valued key: a string (may_name_field: a field's name counts).
absl::StatusOr<Template> RequiredTemplate(const Keys& keys, const std::string& name,
                                          const std::string& task_file, int root_line,
                                          bool may_name_field) {
  const Entry* e = Find(keys, name);
  if (e == nullptr || e->value.IsNull()) {
    return Problem(task_file, root_line, name, "missing: every document needs it");
  }
  if (!e->value.IsScalar()) return Problem(*e, name, "expected a string");
  return CompileTemplate(e->value.Scalar(), name, e->file, e->line, may_name_field);
}

absl::StatusOr<Spec> CompileSpec(const Keys& keys, const std::string& task_file, int root_line) {
  Spec spec;
  if (const Entry* e = Find(keys, "description"); e != nullptr && !e->value.IsNull()) {
    if (!e->value.IsScalar()) return Problem(*e, "description", "expected a string");
    absl::StatusOr<Template> t =
        CompileTemplate(e->value.Scalar(), "description", e->file, e->line, false);
    if (!t.ok()) return t.status();
    spec.description = *std::move(t);
  }
  absl::StatusOr<Template> text = RequiredTemplate(keys, "doc_to_text", task_file, root_line, true);
  if (!text.ok()) return text.status();
  spec.text = *std::move(text);

  const Entry* choice = Find(keys, "doc_to_choice");
  if (choice != nullptr && choice->value.IsSequence()) {
    for (size_t i = 0; i < choice->value.size(); ++i) {
      const YAML::Node item = choice->value[i];
      const std::string field = absl::StrCat("doc_to_choice[", i, "]");
      if (!item.IsScalar()) return Problem(*choice, field, "expected a string");
      absl::StatusOr<Template> t =
          CompileTemplate(item.Scalar(), field, choice->file,
                          YamlLine(item) > 0 ? YamlLine(item) : choice->line, false);
      if (!t.ok()) return t.status();
      spec.choice_list.push_back(*std::move(t));
    }
    if (spec.choice_list.size() < 2) {
      return Problem(*choice, "doc_to_choice",
                     absl::StrCat("lists ", spec.choice_list.size(),
                                  " choice(s) — multiple_choice needs at least 2"));
    }
  } else {
    absl::StatusOr<Template> t =
        RequiredTemplate(keys, "doc_to_choice", task_file, root_line, true);
    if (!t.ok()) return t.status();
    spec.choice = *std::move(t);
  }

  const Entry* target = Find(keys, "doc_to_target");
  int64_t index = 0;
  // A plain (unquoted) YAML integer is an index; a quoted one is a string of digits, the same.
  if (target != nullptr && target->value.IsScalar() && target->value.Tag() == "?" &&
      absl::SimpleAtoi(target->value.Scalar(), &index)) {
    spec.target_index = index;
  } else {
    absl::StatusOr<Template> t =
        RequiredTemplate(keys, "doc_to_target", task_file, root_line, true);
    if (!t.ok()) return t.status();
    spec.target = *std::move(t);
  }
  return spec;
}

// ---- The documents ------------------------------------------------------------------------

// Where a document is: its data file and line (JSON Lines) or index (an array).
struct DocPlace {
  std::string file;
  int line = 0;  // 0: in an array
  size_t index = 0;
};

absl::Status DocProblem(const DocPlace& place, const std::string& field, const std::string& what) {
  if (place.line > 0) return Problem(place.file, place.line, field, what);
  return Problem(
      place.file, 0, "",
      absl::StrCat("document [", place.index, "]: ", field, field.empty() ? "" : ": ", what));
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string ParseMessage(const std::string& what) {
  const size_t end = what.find("] ");
  return end == std::string::npos ? what : what.substr(end + 2);
}

// A template's error on a document, naming where the template is written.
absl::Status TemplateProblem(const DocPlace& place, const Template& t, const absl::Status& s) {
  return DocProblem(place, t.field, absl::StrCat(s.message(), " (", t.file, ":", t.line, ")"));
}

// The text of a template for the context and the items of a doc_to_choice list: as Jinja renders
// it, so a template of one {{ expression }} giving a number or a list is its Python str(). Only a
// field named by the whole string must be a string (the harness would fail on another type).
absl::StatusOr<std::string> RenderText(const Template& t, const Json& doc, const DocPlace& place) {
  Eval v = Apply(t, doc);
  if (!v.ok()) return TemplateProblem(place, t, v.status());
  if (t.may_name_field && doc.contains(t.source) && !v->is_string()) {
    return DocProblem(place, t.field,
                      absl::StrCat("the field '", t.source, "' is ", AType(*v), ", not a string"));
  }
  return Text(*v);
}

// A choice's text: a string, or a number as Python writes it.
absl::StatusOr<std::string> ChoiceText(const Json& v, size_t i, const DocPlace& place) {
  if (v.is_string()) return v.get<std::string>();
  if (IsNumber(v)) return Text(v);
  return DocProblem(
      place, "doc_to_choice",
      absl::StrCat("choice [", i, "] is ", AType(v), " (", Repr(v), "), not a string"));
}

absl::StatusOr<ChoiceItem> MakeItem(const Spec& spec, const Json& doc, const DocPlace& place) {
  ChoiceItem item;
  if (spec.description) {
    absl::StatusOr<std::string> d = RenderText(*spec.description, doc, place);
    if (!d.ok()) return d.status();
    item.context = *std::move(d);
  }
  absl::StatusOr<std::string> text = RenderText(spec.text, doc, place);
  if (!text.ok()) return text.status();
  item.context += *text;

  if (spec.choice) {
    Eval v = Apply(*spec.choice, doc);
    if (!v.ok()) return TemplateProblem(place, *spec.choice, v.status());
    if (!v->is_array()) {
      return DocProblem(place, "doc_to_choice",
                        absl::StrCat("gives ", AType(*v), " (", Repr(*v),
                                     "), not a list of choices (a field holding a list, or "
                                     "{{ [a, b] }})"));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      absl::StatusOr<std::string> c = ChoiceText((*v)[i], i, place);
      if (!c.ok()) return c.status();
      item.choices.push_back(*std::move(c));
    }
  } else {
    for (const Template& t : spec.choice_list) {
      absl::StatusOr<std::string> c = RenderText(t, doc, place);
      if (!c.ok()) return c.status();
      item.choices.push_back(*std::move(c));
    }
  }
  if (item.choices.size() < 2) {
    return DocProblem(place, "doc_to_choice",
                      absl::StrCat("gives ", item.choices.size(),
                                   " choice(s) — multiple_choice needs at least 2"));
  }

  int64_t gold = 0;
  if (spec.target_index) {
    gold = *spec.target_index;
  } else {
    Eval v = Apply(*spec.target, doc);
    if (!v.ok()) return TemplateProblem(place, *spec.target, v.status());
    if (IsInt(*v)) {
      gold = v->get<int64_t>();
    } else if (v->is_string()) {
      const std::string& s = v->get_ref<const std::string&>();
      const bool digits = !s.empty() && std::all_of(s.begin(), s.end(),
                                                    [](char c) { return c >= '0' && c <= '9'; });
      if (digits) {
        if (!absl::SimpleAtoi(s, &gold)) {
          return DocProblem(place, "doc_to_target", absl::StrCat(s, " is too large an index"));
        }
      } else {
        const std::optional<size_t> i = IndexOf(Json(item.choices), *v);
        if (!i) {
          return DocProblem(
              place, "doc_to_target",
              absl::StrCat("gives ", PythonStringRepr(s), ", which is not one of the choices ",
                           Text(Json(item.choices))));
        }
        gold = static_cast<int64_t>(*i);
      }
    } else {
      return DocProblem(place, "doc_to_target",
                        absl::StrCat("gives ", AType(*v), " (", Repr(*v),
                                     "): expected the index of the right choice or its text",
                                     v->is_array() ? " (one right choice per document)" : ""));
    }
  }
  if (gold < 0 || gold >= static_cast<int64_t>(item.choices.size())) {
    return DocProblem(place, "doc_to_target",
                      absl::StrCat("gives ", gold, ", out of range for ", item.choices.size(),
                                   " choices (0 to ", item.choices.size() - 1, ")"));
  }
  item.gold = static_cast<int>(gold);
  return item;
}

// The documents of one data file, up to `room` of them (0: all), each with its place.
absl::Status ReadDocuments(const std::string& file, const std::string& text, size_t room,
                           std::vector<std::pair<Json, DocPlace>>* docs) {
  size_t start = 0;
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) start = 3;  // a UTF-8 byte order mark
  const size_t first = text.find_first_not_of(" \t\r\n", start);
  if (first != std::string::npos && text[first] == '[') {
    Json all;
    try {
      all = Json::parse(text.begin() + static_cast<std::ptrdiff_t>(start), text.end());
    } catch (const Json::parse_error& e) {
      const size_t byte = std::min<size_t>(start + e.byte, text.size());
      const int line =
          1 + static_cast<int>(std::count(
                  text.begin(), text.begin() + static_cast<std::ptrdiff_t>(byte > 0 ? byte - 1 : 0),
                  '\n'));
      return Problem(file, line, "", absl::StrCat("not valid JSON: ", ParseMessage(e.what())));
    }
    if (!all.is_array()) return Problem(file, 0, "", "expected a JSON array of documents");
    for (size_t i = 0; i < all.size() && (room == 0 || docs->size() < room); ++i) {
      const DocPlace place{file, 0, i};
      if (!all[i].is_object()) {
        return DocProblem(place, "",
                          absl::StrCat("a document is a JSON object, got ", AType(all[i])));
      }
      docs->emplace_back(std::move(all[i]), place);
    }
    return absl::OkStatus();
  }
  // JSON Lines.
  size_t pos = start;
  int line = 0;
  while (pos < text.size() && (room == 0 || docs->size() < room)) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line;
    const std::string row = text.substr(pos, end - pos);
    pos = end + 1;
    if (row.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json doc;
    try {
      doc = Json::parse(row);
    } catch (const Json::parse_error& e) {
      std::string what = ParseMessage(e.what());
      // The line is this row: say the column only.
      if (absl::StartsWith(what, "parse error at line 1, column")) {
        what = absl::StrCat("parse error at column", what.substr(29));
      }
      return Problem(file, line, "", absl::StrCat("not valid JSON: ", what));
    }
    if (!doc.is_object()) {
      return Problem(file, line, "",
                     absl::StrCat("a document is a JSON object, got ", AType(doc),
                                  " (JSON Lines: one object per line)"));
    }
    docs->emplace_back(std::move(doc), DocPlace{file, line, 0});
  }
  return absl::OkStatus();
}

// "LENGTH\n" then the bytes: files that differ only in where one ends and the next begins hash
// differently.
void HashContent(const std::string& content, Sha256Stream* hash) {
  const std::string length = absl::StrCat(content.size(), "\n");
  hash->Update(length.data(), length.size());
  hash->Update(content.data(), content.size());
}

// A task's name becomes its metrics' names (NAME@acc_norm): one word.
bool ValidTaskName(const std::string& name) {
  if (name.empty()) return false;
  for (const char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '@' || u <= ' ' || u == 0x7f) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<ChoiceTask> LoadChoiceTask(const std::string& path, int limit) {
  if (limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the limit of documents must be >= 0 (0: all), got ", limit));
  }
  ChoiceTask task;
  task.file = path;
  std::vector<std::string> texts;
  Keys keys;
  std::error_code error;
  std::vector<std::string> stack = {fs::weakly_canonical(path, error).string()};
  if (absl::Status s = ReadTaskTree(path, &stack, &texts, &keys); !s.ok()) return s;
  constexpr int kRootLine = 1;  // for a key that is missing: the file's first line

  absl::StatusOr<std::optional<std::string>> name = OptionalScalar(keys, "task");
  if (!name.ok()) return name.status();
  if (!*name) {
    return Problem(path, kRootLine, "task", "missing: the task's name (its metrics' names)");
  }
  if (!ValidTaskName(**name)) {
    return Problem(*Find(keys, "task"), "task",
                   absl::StrCat("'", **name,
                                "' is not a usable name: one word without spaces or '@' (the "
                                "metrics are NAME, NAME@acc_norm, NAME@logprob)"));
  }
  task.name = **name;
  if (absl::Status s = CheckSettings(keys, path, kRootLine); !s.ok()) return s;

  absl::StatusOr<std::optional<std::string>> delimiter = OptionalScalar(keys, "target_delimiter");
  if (!delimiter.ok()) return delimiter.status();
  if (const Entry* e = Find(keys, "target_delimiter"); e != nullptr && e->value.IsNull()) {
    return Problem(*e, "target_delimiter", "expected a string (\"\" for none)");
  }
  if (*delimiter) task.target_delimiter = **delimiter;

  // The split evaluated: test_split when set, else validation_split.
  std::string split_key = "test_split";
  absl::StatusOr<std::optional<std::string>> split = OptionalScalar(keys, split_key);
  if (!split.ok()) return split.status();
  if (!*split) {
    split_key = "validation_split";
    split = OptionalScalar(keys, split_key);
    if (!split.ok()) return split.status();
  }
  if (!*split) {
    return Problem(path, kRootLine, "test_split",
                   "missing: the split evaluated is test_split, or validation_split when "
                   "test_split is not set — neither is");
  }
  absl::StatusOr<std::vector<std::string>> files =
      DataFiles(keys, **split, split_key, path, kRootLine);
  if (!files.ok()) return files.status();
  task.data_files = *std::move(files);

  absl::StatusOr<Spec> spec = CompileSpec(keys, path, kRootLine);
  if (!spec.ok()) return spec.status();

  Sha256Stream hash;
  for (const std::string& text : texts) HashContent(text, &hash);
  double chance_sum = 0;
  for (const std::string& file : task.data_files) {
    absl::StatusOr<std::string> text = ReadWholeFile(file);
    if (!text.ok()) {
      // Say which task file names it.
      const Entry* kwargs = Find(keys, "dataset_kwargs");
      return absl::NotFoundError(YamlProblem(kwargs->file, kwargs->line,
                                             "dataset_kwargs.data_files",
                                             std::string(text.status().message())));
    }
    HashContent(*text, &hash);
    const size_t room = limit == 0 ? 0 : static_cast<size_t>(limit) - task.items.size();
    if (limit != 0 && room == 0) continue;  // every data file is still in the fingerprint
    std::vector<std::pair<Json, DocPlace>> docs;
    if (absl::Status s = ReadDocuments(file, *text, room, &docs); !s.ok()) return s;
    for (const auto& [doc, place] : docs) {
      absl::StatusOr<ChoiceItem> item = MakeItem(*spec, doc, place);
      if (!item.ok()) return item.status();
      chance_sum += 1.0 / static_cast<double>(item->choices.size());
      task.items.push_back(*std::move(item));
    }
  }
  if (task.items.empty()) {
    return Problem(task.data_files.front(), 0, "",
                   absl::StrCat("no documents in the split '", **split, "' of ", path));
  }
  task.fingerprint = hash.Hex().substr(0, 16);
  task.chance = chance_sum / static_cast<double>(task.items.size());
  return task;
}

std::vector<std::string> ChoiceMetricNames(const std::string& name) {
  return {name, absl::StrCat(name, "@acc_norm"), absl::StrCat(name, "@logprob")};
}

absl::Status ApplyChoiceTasks(RunConfig* config) {
  TrainConfig* train = config->mutable_train();
  for (int i = 0; i < train->evals_size(); ++i) {
    EvalTask* t = train->mutable_evals(i);
    if (t->task() != kMultipleChoiceTask) continue;
    const std::string prefix = absl::StrCat("train.evals[", i, "].file: ");
    if (t->file().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "multiple_choice needs a task file"));
    }
    absl::StatusOr<ChoiceTask> task = LoadChoiceTask(t->file(), t->samples());
    if (!task.ok()) {
      return absl::Status(task.status().code(), absl::StrCat(prefix, task.status().message()));
    }
    t->set_name(task->name);
    t->set_fingerprint(task->fingerprint);
    t->set_chance(task->chance);
  }
  return absl::OkStatus();
}

}  // namespace ablate
