#include "common/text_format.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "fmt/format.h"

namespace ablate {

std::string FormatCount(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -(n + 1) + uint64_t{1} : uint64_t(n));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return n < 0 ? "-" + out : out;
}

std::string SignedCount(int64_t n) { return n > 0 ? "+" + FormatCount(n) : FormatCount(n); }

std::string HumanCount(double count, bool sign) {
  const char* prefix = sign && count > 0 ? "+" : "";
  const double a = std::fabs(count);
  if (a >= 1e9) return fmt::format("{}{:.2f}B", prefix, count / 1e9);
  if (a >= 1e6) return fmt::format("{}{:.2f}M", prefix, count / 1e6);
  if (a >= 1e3) return fmt::format("{}{:.1f}K", prefix, count / 1e3);
  return fmt::format("{}{:.0f}", prefix, count);
}

std::string Engineering(double v) {
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  return fmt::format("{:.3g}{}", v, units[u]);
}

std::string FormatFlops(double flops) {
  if (flops < 1000) return fmt::format("{:.0f}", flops);
  // "3.40e+08" -> "3.40e8"
  std::string s = fmt::format("{:.2e}", flops);
  const size_t e = s.find('e');
  std::string exponent = s.substr(e + 1);
  if (!exponent.empty() && exponent[0] == '+') exponent.erase(0, 1);
  exponent.erase(0, std::min(exponent.find_first_not_of('0'), exponent.size() - 1));
  return s.substr(0, e + 1) + exponent;
}

std::string FormatBytes(double bytes) {
  if (bytes >= 1e12) return fmt::format("{:.2f} TB", bytes / 1e12);
  if (bytes >= 1e9) return fmt::format("{:.1f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

std::string FormatDuration(double seconds) {
  if (seconds >= 3600) return fmt::format("{:.1f} h", seconds / 3600);
  if (seconds >= 120) return fmt::format("{:.1f} min", seconds / 60);
  return fmt::format("{:.0f} s", seconds);
}

std::string FormatDeviceTime(double seconds) {
  const double hours = seconds / 3600;
  if (hours >= 1000) {
    return FormatCount(static_cast<int64_t>(std::llround(hours))) + " device-hours";
  }
  if (hours >= 1) return fmt::format("{:.3g} device-hours", hours);
  if (seconds >= 60) return fmt::format("{:.3g} device-minutes", seconds / 60);
  return fmt::format("{:.3g} device-seconds", seconds);
}

std::string MeanStdText(double mean, double std, int decimals) {
  if (!std::isfinite(mean)) return "—";
  if (!std::isfinite(std)) return fmt::format("{:.{}f}", mean, decimals);
  return fmt::format("{:.{}f} ± {:.{}f}", mean, decimals, std, decimals);
}

std::string CsvField(absl::string_view s) {
  if (s.find_first_of(",\"\n\r") == absl::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string CsvText(absl::string_view s) {
  if (!s.empty() && absl::string_view("=+-@\t\r").find(s.front()) != absl::string_view::npos) {
    return CsvField(absl::StrCat("'", s));
  }
  return CsvField(s);
}

std::string MarkdownText(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    switch (c) {
      case '|':
        out += "\\|";
        break;
      case '[':
        out += "\\[";
        break;
      case ']':
        out += "\\]";
        break;
      case '<':
        out += "&lt;";
        break;  // no tag can start (a lone '>' starts none)
      case '&':
        out += "&amp;";
        break;
      case '\r':
        if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
        out += ' ';
        break;
      case '\n':
        out += ' ';
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string CsvNumber(double v) { return std::isfinite(v) ? fmt::format("{}", v) : ""; }

std::string AlignedTable(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& right, bool rule) {
  std::vector<size_t> width(header.size(), 0);
  auto display_width = [](const std::string& s) {
    // UTF-8: count code points, not bytes ("±", "—").
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  for (size_t i = 0; i < header.size(); ++i) width[i] = display_width(header[i]);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], display_width(row[i]));
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t i = 0; i < cells.size(); ++i) {
      const size_t pad = width[i] - display_width(cells[i]);
      if (i > 0) out += "  ";
      if (right[i]) out.append(pad, ' ');
      out += cells[i];
      if (!right[i] && i + 1 < cells.size()) out.append(pad, ' ');
    }
    return out + "\n";
  };
  std::string out = line(header);
  if (rule) {
    std::vector<std::string> dashes;
    for (size_t w : width) dashes.push_back(std::string(w, '-'));
    out += line(dashes);
  }
  for (const auto& row : rows) out += line(row);
  return out;
}

}  // namespace ablate
