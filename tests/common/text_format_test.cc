// The text every output shares (common/text_format.h): counts, FLOPs, bytes and times as `ablate
// expand`, `table`, `compare` and `report` print them, and the memory plan's messages.
#include "common/text_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace ablate {
namespace {

// Each value of `cases` through `format`, against the text it must print.
template <typename Value, size_t N>
void ExpectTexts(std::string (*format)(Value), const std::pair<Value, const char*> (&cases)[N]) {
  for (const auto& [value, text] : cases) EXPECT_EQ(format(value), text) << value;
}

TEST(FormatCountTest, Separators) {
  const std::pair<int64_t, const char*> kCases[] = {{0, "0"},
                                                    {999, "999"},
                                                    {1000, "1,000"},
                                                    {-57344, "-57,344"},
                                                    {15577227264, "15,577,227,264"}};
  ExpectTexts(FormatCount, kCases);
}

TEST(FormatFlopsTest, ThreeDigitsInENotation) {
  const std::pair<double, const char*> kCases[] = {
      {999, "999"}, {1234, "1.23e3"}, {2.1e21, "2.10e21"}, {3.4e8, "3.40e8"}, {4.23e11, "4.23e11"}};
  ExpectTexts(FormatFlops, kCases);
}

TEST(FormatBytesTest, DecimalUnits) {
  const std::pair<double, const char*> kCases[] = {
      {1.5e12, "1.50 TB"}, {80e9, "80.0 GB"},       {35.8e6, "35.8 MB"}, {200e6, "200.0 MB"},
      {10000, "10.0 kB"},  {int64_t{512}, "512 B"}, {0, "0 B"}};
  ExpectTexts(FormatBytes, kCases);
}

TEST(FormatDurationTest, SecondsMinutesHours) {
  const std::pair<double, const char*> kCases[] = {{7, "7 s"},       {119, "119 s"},
                                                   {120, "2.0 min"}, {738, "12.3 min"},
                                                   {3600, "1.0 h"},  {14760, "4.1 h"}};
  ExpectTexts(FormatDuration, kCases);
}

TEST(FormatDeviceTimeTest, HoursMinutesSeconds) {
  const std::pair<double, const char*> kCases[] = {{1500 * 3600.0, "1,500 device-hours"},
                                                   {140048 * 3600.0, "140,048 device-hours"},
                                                   {2.38 * 3600, "2.38 device-hours"},
                                                   {90, "1.5 device-minutes"},
                                                   {42, "42 device-seconds"}};
  ExpectTexts(FormatDeviceTime, kCases);
}

TEST(MeanStdTextTest, MeanWithItsDeviation) {
  EXPECT_EQ(MeanStdText(2.06174, 0.0132, 3), "2.062 ± 0.013");
  EXPECT_EQ(MeanStdText(2.06174, NAN, 3), "2.062");
  EXPECT_EQ(MeanStdText(NAN, NAN, 3), "—");
}

TEST(HumanCountTest, AsPapersPrintThem) {
  EXPECT_EQ(HumanCount(1.1e6), "1.10M");
  EXPECT_EQ(HumanCount(16400, /*sign=*/true), "+16.4K");
  EXPECT_EQ(HumanCount(512), "512");
  EXPECT_EQ(HumanCount(0, /*sign=*/true), "0");
}

}  // namespace
}  // namespace ablate
